//! TLS for every listener (the protocol port and the metrics port) and for
//! the client, on rustls with the `ring` provider.
//!
//! - The server presents `--tls-cert` (a PEM chain, leaf first) with
//!   `--tls-key` (a PEM PKCS#8, PKCS#1 or SEC1 key). With
//!   `--tls-client-ca` it also requires a client certificate chaining to
//!   that CA (mutual TLS); without it, any client may connect and the
//!   token alone authenticates.
//! - The client trusts `--tls-ca` (PEM, one or more certificates) and may
//!   present its own certificate and key for mutual TLS.
//!
//! The provider is passed explicitly rather than installed process-wide, so
//! a library user's own rustls setup is never disturbed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use tokio_rustls::{TlsAcceptor, TlsConnector};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {path}: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in order.
pub fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |reason: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Pem {
        what: "a private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn roots(path: &Path, what: &'static str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, what)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// Where the server's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate that chains to it.
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Reads the files and builds the acceptor every listener shares.
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let certs = load_certs(&self.cert, "a certificate")?;
        let key = load_key(&self.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let roots = roots(path, "a client CA certificate")?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(certs, key)?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// A client's TLS settings: whom to trust, what name to check, and an
/// optional identity for mutual TLS.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the certificates in `ca` and checks the server's certificate
    /// against `server_name` (a DNS name or an IP address). `identity` is
    /// `(cert, key)` PEM files for mutual TLS.
    pub fn new(
        ca: &Path,
        server_name: &str,
        identity: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots(ca, "a CA certificate")?);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert, "a client certificate")?, load_key(key)?)?,
        };
        let server_name = ServerName::try_from(server_name.to_string()).map_err(|e| {
            TlsError::Rustls(rustls::Error::General(format!(
                "bad server name {server_name:?}: {e}"
            )))
        })?;
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// Runs the TLS handshake over an open TCP stream.
    pub async fn connect(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector
            .connect(self.server_name.clone(), stream)
            .await
    }
}
