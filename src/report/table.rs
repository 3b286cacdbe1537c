//! Plain-text tables and number formatting for people.

/// A table with a header row; columns are padded to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            rows: vec![header.into_iter().map(Into::into).collect()],
        }
    }

    /// Adds a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table as text, two spaces between columns, no trailing blanks.
    pub fn render(&self) -> String {
        let n = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; n];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Bytes as a person reads them (`1.5 GiB`).
pub(crate) fn bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = crate::num::f64_from(b);
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned() {
        let mut t = Table::new(["A", "BB"]);
        t.row(["long", "x"]);
        assert_eq!(t.render(), "A     BB\nlong  x\n");
    }

    #[test]
    fn human_bytes() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
