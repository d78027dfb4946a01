//! Plain-text tables for the terminal.

use std::fmt;

/// A titled table: a header row, rows of cells, and notes printed under it. The first column
/// is left-aligned, the others right-aligned (they hold figures).
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|h| h.to_string()).collect(),
            ..Table::default()
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0; cols];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate() {
                width[i] = width[i].max(cell.chars().count());
            }
        }
        writeln!(f, "{}", self.title)?;
        let line = |f: &mut fmt::Formatter<'_>, row: &[String]| -> fmt::Result {
            let mut out = String::new();
            for (i, w) in width.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                let pad = w - cell.chars().count();
                if i == 0 {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str("  ");
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                }
            }
            writeln!(f, "  {}", out.trim_end())
        };
        line(f, &self.header)?;
        let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        writeln!(f, "  {}", "-".repeat(total))?;
        for row in &self.rows {
            line(f, row)?;
        }
        for note in &self.notes {
            writeln!(f, "  {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned() {
        let mut t = Table::new("T", &["mode", "Mops/s"]);
        t.row(vec!["poll".into(), "12.5".into()]);
        t.row(vec!["sleep, event idx".into(), "1.0".into()]);
        let s = t.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "T");
        assert_eq!(lines[1], "  mode              Mops/s");
        assert_eq!(lines[3], "  poll                12.5");
        assert_eq!(lines[4], "  sleep, event idx     1.0");
    }
}
