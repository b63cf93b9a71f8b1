//! fuzzing (stub)
