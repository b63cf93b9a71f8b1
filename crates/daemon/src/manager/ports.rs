//! Exposed ports: which sandbox ports the port proxy serves (`crate::proxy`). Stored per
//! sandbox id, so branch children and sandboxes started from a snapshot begin with
//! none, and a deletion takes them along (`finish_delete`).
use std::net::SocketAddr;

use super::{now, Manager};
use crate::db::{AddPort, PortRow};
use crate::error::{Error, Result};
use crate::model::{ExposePortRequest, Validate};
use crate::network::Network;
use crate::proxy::{Lookup, Target, WakeFuture};

impl Manager {
    /// Exposes a port of a running sandbox.
    pub fn expose_port(&self, id: &str, req: &ExposePortRequest) -> Result<PortRow> {
        req.validate()?;
        if !self.network.isolated() {
            return Err(Error::Unsupported(format!(
                "exposing ports needs isolated networking; this daemon runs the {} backend \
                 (GET /v1/info: network)",
                self.network.info().backend
            )));
        }
        let row = self.sandbox_row(id)?;
        self.running_vm(&row)?;
        if Network::guest_address(&row.network).is_none() {
            return Err(Error::Unsupported(format!(
                "sandbox {id} has no address the host can reach (it was made without \
                 isolated networking)"
            )));
        }
        let port = PortRow {
            sandbox: id.to_string(),
            port: u16::try_from(req.port).expect("validated"),
            public: req.public,
            created_at: now(),
        };
        match self.db.add_port(&port)? {
            AddPort::Added => {
                tracing::info!(
                    "sandbox {id}: port {} exposed{}",
                    port.port,
                    if port.public { " (public)" } else { "" }
                );
                Ok(port)
            }
            AddPort::Exists => Err(Error::Conflict(format!(
                "port {} of sandbox {id} is exposed already",
                port.port
            ))),
            // It stopped (or went) since it was looked at: say which.
            AddPort::NotRunning => Err(self
                .sandbox_row(id)
                .and_then(|r| self.running_vm(&r))
                .err()
                .unwrap_or_else(|| Error::Busy(id.to_string()))),
        }
    }

    pub fn ports(&self, id: &str) -> Result<Vec<PortRow>> {
        self.sandbox_row(id)?;
        self.db.ports(id)
    }

    pub fn unexpose_port(&self, id: &str, port: u16) -> Result<()> {
        self.sandbox_row(id)?;
        if !self.db.delete_port(id, port)? {
            return Err(Error::NotFound {
                what: "exposed port",
                id: format!("{id}:{port}"),
            });
        }
        tracing::info!("sandbox {id}: port {port} no longer exposed");
        Ok(())
    }
}

/// The proxy's view: an exposed port of a sandbox with an address on the host's side.
impl Lookup for Manager {
    fn lookup(&self, sandbox: &str, port: u16) -> Option<Target> {
        let found = self
            .db
            .port(sandbox, port)
            .and_then(|p| Ok(p.zip(self.db.sandbox(sandbox)?)));
        match found {
            Ok(Some((p, row))) => Network::guest_address(&row.network).map(|ip| Target {
                addr: SocketAddr::new(ip.into(), port),
                public: p.public,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::error!("port proxy: looking up {sandbox}:{port}: {e}");
                None
            }
        }
    }

    fn wake<'a>(&'a self, sandbox: &'a str) -> WakeFuture<'a> {
        Box::pin(async move {
            Manager::wake(self, sandbox)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
