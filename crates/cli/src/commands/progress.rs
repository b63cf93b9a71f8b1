//! Progress of long benches and fan-outs (`zygote branch -c N`), on stderr only (stdout
//! carries the table, the ids or the JSON).
//!
//! On a terminal, one indicatif bar redrawn in place; otherwise (a log file, a pipe, CI)
//! one complete line per step. The old `eprint!("\r...")` ran every step together on one
//! line wherever `\r` does not return the cursor.
use std::fmt::Display;
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Steps {
    bar: Option<ProgressBar>,
    label: String,
    total: usize,
    done: usize,
}

/// The line printed for step `done` of `total` when stderr is not a terminal.
pub fn plain_line(label: &str, done: usize, total: usize, msg: &str) -> String {
    if msg.is_empty() {
        format!("{label} {done}/{total}")
    } else {
        format!("{label} {done}/{total}: {msg}")
    }
}

impl Steps {
    pub fn new(label: &str, total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::new(total as u64);
            pb.set_style(
                ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} [{elapsed}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            pb.set_prefix(label.to_string());
            pb
        });
        Self {
            bar,
            label: label.to_string(),
            total,
            done: 0,
        }
    }

    /// One step finished; `msg` says what it measured (may be empty).
    pub fn step(&mut self, msg: impl Display) {
        self.done += 1;
        let msg = msg.to_string();
        match &self.bar {
            Some(pb) => {
                pb.set_message(msg);
                pb.inc(1);
            }
            None => eprintln!("{}", plain_line(&self.label, self.done, self.total, &msg)),
        }
    }

    /// A line about the run that is not a step (above the bar on a terminal).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(pb) => pb.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    /// Leave the finished bar on screen (it is the last step's line).
    pub fn finish(self) {
        if let Some(pb) = self.bar {
            pb.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_are_whole_lines() {
        assert_eq!(plain_line("idle", 3, 20, ""), "idle 3/20");
        assert_eq!(
            plain_line("dirtying", 20, 20, "fork pause 1.7 ms"),
            "dirtying 20/20: fork pause 1.7 ms"
        );
        assert!(!plain_line("a", 1, 2, "b").contains('\r'));
    }
}
