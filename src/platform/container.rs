//! Evidence that this process runs in a container (the doctor's
//! `container` check): a pure function of a filesystem root and the
//! environment, so tests use fake roots.
//!
//! Each item is evidence, not proof: `/.dockerenv` survives in images
//! exported from Docker and run elsewhere (a VM built from one, say), and a
//! private cgroup namespace shows `/` as the path. The doctor prints what it
//! saw; [`ContainerEvidence::likely`] only says whether anything was seen.

use std::path::Path;

/// Runtimes recognised from cgroup paths, in the order checked.
const CGROUP_HINTS: [(&str, &str); 9] = [
    ("kubepods", "kubernetes"),
    ("docker", "docker"),
    ("libpod", "podman"),
    ("cri-containerd", "containerd"),
    ("containerd", "containerd"),
    ("crio", "cri-o"),
    ("lxc", "lxc"),
    ("garden", "garden"),
    ("actions_job", "github-actions"),
];

/// What was seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerEvidence {
    /// `/.dockerenv` exists.
    pub dockerenv: bool,
    /// `/run/.containerenv` exists (podman, buildah).
    pub containerenv: bool,
    /// `KUBERNETES_SERVICE_HOST` is set.
    pub kubernetes_env: bool,
    /// `container=` is set (systemd-nspawn, podman, lxc set it for init).
    pub container_var: Option<String>,
    /// The cgroup paths of `/proc/self/cgroup`, one per hierarchy
    /// (`0::/...` for v2), without duplicates.
    pub cgroup_paths: Vec<String>,
    /// Runtimes a cgroup path names (`docker`, `kubernetes`, ...).
    pub cgroup_runtimes: Vec<&'static str>,
}

impl ContainerEvidence {
    /// Whether any evidence was found.
    pub fn likely(&self) -> bool {
        self.dockerenv
            || self.containerenv
            || self.kubernetes_env
            || self.container_var.is_some()
            || !self.cgroup_runtimes.is_empty()
    }

    /// The evidence in a phrase (empty when there is none).
    pub fn summary(&self) -> String {
        let mut v = Vec::new();
        if self.dockerenv {
            v.push("/.dockerenv exists".to_string());
        }
        if self.containerenv {
            v.push("/run/.containerenv exists".to_string());
        }
        if self.kubernetes_env {
            v.push("KUBERNETES_SERVICE_HOST is set".to_string());
        }
        if let Some(c) = &self.container_var {
            v.push(format!("container={c}"));
        }
        if !self.cgroup_runtimes.is_empty() {
            v.push(format!(
                "cgroup path names {}",
                self.cgroup_runtimes.join(", ")
            ));
        }
        if !v.is_empty() && !self.cgroup_paths.is_empty() {
            v.push(format!("cgroup {}", self.cgroup_paths.join(" ")));
        }
        v.join(", ")
    }
}

/// Gathers the evidence under `root` (`/` for this machine) with `env`
/// looking up environment variables.
pub(crate) fn detect(root: &Path, env: impl Fn(&str) -> Option<String>) -> ContainerEvidence {
    let exists = |p: &str| root.join(p).symlink_metadata().is_ok();
    let mut cgroup_paths: Vec<String> = Vec::new();
    if let Ok(text) = std::fs::read(root.join("proc/self/cgroup")) {
        for line in String::from_utf8_lossy(&text).lines() {
            // hierarchy-ID:controllers:path (the path may hold ':')
            let mut it = line.splitn(3, ':');
            let (Some(_), Some(_), Some(path)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if !cgroup_paths.iter().any(|p| p == path) {
                cgroup_paths.push(path.to_string());
            }
        }
    }
    let mut cgroup_runtimes = Vec::new();
    for (needle, name) in CGROUP_HINTS {
        if cgroup_paths.iter().any(|p| p.contains(needle)) && !cgroup_runtimes.contains(&name) {
            cgroup_runtimes.push(name);
        }
    }
    ContainerEvidence {
        dockerenv: exists(".dockerenv"),
        containerenv: exists("run/.containerenv"),
        kubernetes_env: env("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty()),
        container_var: env("container").filter(|v| !v.is_empty()),
        cgroup_paths,
        cgroup_runtimes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::fake_root as root;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn bare_host_shows_nothing() {
        let d = root(&[(
            "proc/self/cgroup",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
        )]);
        let e = detect(d.path(), no_env);
        assert!(!e.likely());
        assert_eq!(e.summary(), "");
        assert_eq!(
            e.cgroup_paths,
            ["/user.slice/user-1000.slice/session-3.scope"]
        );
    }

    #[test]
    fn docker_v1_and_v2() {
        let d = root(&[
            (".dockerenv", ""),
            ("proc/self/cgroup", "12:memory:/docker/0123abcd\n11:cpu,cpuacct:/docker/0123abcd\n0::/system.slice/docker-0123abcd.scope\n"),
        ]);
        let e = detect(d.path(), no_env);
        assert!(e.dockerenv && e.likely());
        assert_eq!(e.cgroup_runtimes, ["docker"]);
        assert_eq!(e.cgroup_paths.len(), 2);
        assert!(
            e.summary().contains("/.dockerenv exists"),
            "{}",
            e.summary()
        );
    }

    #[test]
    fn kubernetes_with_private_cgroup_namespace() {
        // cgroupns=private: the path is "/", only the variable tells.
        let d = root(&[("proc/self/cgroup", "0::/\n")]);
        let e = detect(d.path(), |k| {
            (k == "KUBERNETES_SERVICE_HOST").then(|| "10.96.0.1".into())
        });
        assert!(e.kubernetes_env && e.likely());
        assert!(e.cgroup_runtimes.is_empty());
        let d = root(&[(
            "proc/self/cgroup",
            "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-9f.scope\n",
        )]);
        let e = detect(d.path(), no_env);
        assert_eq!(e.cgroup_runtimes, ["kubernetes", "containerd"]);
    }

    #[test]
    fn podman_and_nspawn() {
        let d = root(&[
            ("run/.containerenv", "engine=\"podman-4.9\"\n"),
            (
                "proc/self/cgroup",
                "0::/user.slice/libpod-abc.scope/container\n",
            ),
        ]);
        let e = detect(d.path(), |k| (k == "container").then(|| "podman".into()));
        assert!(e.containerenv);
        assert_eq!(e.container_var.as_deref(), Some("podman"));
        assert_eq!(e.cgroup_runtimes, ["podman"]);
    }

    #[test]
    fn unreadable_or_odd_files_are_not_errors() {
        let d = root(&[(
            "proc/self/cgroup",
            "garbage\n\u{0}::\n1:name=systemd:/a:b\n",
        )]);
        let e = detect(d.path(), |k| {
            (k == "KUBERNETES_SERVICE_HOST").then(String::new)
        });
        assert!(!e.kubernetes_env);
        assert!(e.cgroup_paths.contains(&"/a:b".to_string()));
        let e = detect(Path::new("/nonexistent-root"), no_env);
        assert_eq!(e, ContainerEvidence::default());
    }
}
