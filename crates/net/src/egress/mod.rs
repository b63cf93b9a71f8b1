//! Rules by name: the guest's TCP connections to the ports that name rules cover go
//! through the daemon's egress proxy inside the sandbox's namespace ([`proxy`]), which
//! reads the name each connection gives ([`sniff`]) and lets it out only when the
//! policy allows the name *and* the address came from this sandbox's DNS answers for
//! it ([`judge`]). CIDR rules stay in nftables (`crate::plan`).
//!
//! Secrets bound to hosts ([`secrets`]): the guest holds placeholders; HTTPS to a bound
//! host is ended by the proxy with a leaf of the daemon's CA ([`ca`]) and relayed with
//! the values swapped in ([`intercept`]).
pub mod ca;
pub mod intercept;
pub mod judge;
pub mod proxy;
pub mod secrets;
pub mod sniff;
