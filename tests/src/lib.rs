//! Helpers for end-to-end tests against the real inboxd binary.
pub mod fuzzing;
