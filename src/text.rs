//! Text for people, as numapin's own messages and tools write it: byte
//! counts ([`fmt_bytes`]), plain-text tables ([`Table`]) and values quoted
//! or shortened so that a hostile one cannot make a message megabytes long
//! ([`quote`], [`shorten`]).
//!
//! ```
//! use numapin::text::{fmt_bytes, Table};
//!
//! let mut t = Table::new(["NODE", "FREE"]);
//! t.row(["0".to_string(), fmt_bytes(3 << 29)]);
//! assert_eq!(t.render(), "NODE  FREE\n0     1.5 GiB\n");
//! ```

pub use crate::arena::fmt_bytes;
pub use crate::report::table::Table;
pub use crate::report::{quote, shorten};
