//! inbox-wire: the inboxd binary protocol. Pure codec: no sockets, no
//! async runtime. See `docs/PROTOCOL.md`.
