//! inbox-server: the inboxd daemon, its async Rust client, and inboxctl.
