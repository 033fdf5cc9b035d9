//! The API's edge against strangers, before any handler runs: which web pages may use the node
//! ([`origin`]: CORS, refused state-changing requests, DNS rebinding). The connections themselves (header
//! timeout, connection cap) are [`crate::server`]'s.

pub mod origin;
