//! The error parts several domains share, written once: a system failure
//! ([`SystemError`]) and an environment variable that cannot be used
//! ([`EnvError`]). Each domain's error enum wraps them in a variant of its
//! own (`TopologyError::System`, `AffinityError::System`,
//! `LoaderError::Setup`, ...) and decides their [`ErrorKind`](super::ErrorKind)
//! there; the message, the fix and the cause are the part's.

/// A cause an error keeps: an I/O error, hwloc's error, the driver's, ...
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The system, hwloc or the CUDA driver failed at what numapin attempted:
/// what that was, what to do, and the cause (the error's
/// [`source`](std::error::Error::source)).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
#[non_exhaustive]
pub struct SystemError {
    /// What was attempted.
    pub what: String,
    /// What to do.
    pub fix: String,
    /// What went wrong.
    #[source]
    pub source: BoxError,
}

impl SystemError {
    /// A failure of `what`, with its `fix` and its cause.
    pub fn new(
        what: impl Into<String>,
        fix: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> SystemError {
        SystemError {
            what: what.into(),
            fix: fix.into(),
            source: source.into(),
        }
    }

    /// The cause as the system's error, when it is one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.source.downcast_ref::<std::io::Error>()
    }
}

/// An environment variable with a value numapin cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{variable}={}: {problem}", super::quote(value))]
#[non_exhaustive]
pub struct EnvError {
    /// The variable's name.
    pub variable: String,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

impl EnvError {
    /// `variable` set to `value`, which cannot be used because of
    /// `problem`; `fix` says what to do.
    pub fn new(
        variable: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> EnvError {
        EnvError {
            variable: variable.into(),
            value: value.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_system_error_shows_what_and_keeps_its_cause() {
        let e = SystemError::new(
            "binding",
            "check the CPUs",
            std::io::Error::from_raw_os_error(libc::EPERM),
        );
        assert_eq!(e.to_string(), "binding");
        assert_eq!(
            e.io_error().and_then(std::io::Error::raw_os_error),
            Some(libc::EPERM)
        );
        assert!(std::error::Error::source(&e).is_some());
        let v = EnvError::new("X", "a\u{1b}", "not a number", "use 1");
        assert_eq!(v.to_string(), "X=\"a\\u{1b}\": not a number");
    }
}
