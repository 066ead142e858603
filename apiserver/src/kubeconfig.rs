//! The kubelet's kubeconfig: where the API server is and the node's credentials for it.
//!
//! Read: the current context's cluster (`server`, `tls-server-name`, `certificate-authority`
//! or `certificate-authority-data`) and user (`client-certificate`/`client-key` or their
//! `-data` forms, `token` or `tokenFile`). Not supported, and refused by name:
//! `insecure-skip-tls-verify`, exec and auth-provider plugins, proxies, basic authentication
//! (`username`/`password`) and impersonation (`as`, `as-uid`, `as-groups`, `as-user-extra`):
//! the node reads as itself or not at all.
//!
//! Every file read (the kubeconfig and each file it names) is kept with its identity (device,
//! inode, size, modification time, as the open file had them), so that a client notices a
//! rotated certificate, key, CA or token file by a `stat` of each and reads them again
//! ([`Kubeconfig::changed`]).
//!
//! Trust: the kubeconfig is never read through a symbolic link, and it must belong to the
//! user kata-topo runs as (root on a node) with no group or other write bit. The files it
//! names (a CA, the client certificate and key, a token file) must be regular files of that
//! user that no one else may write; one of them may be a symbolic link when the link too is
//! that user's — the kubelet rotates its client certificate and points
//! `kubelet-client-current.pem` at the newest one, and kubeadm's `kubelet.conf` names that
//! link. A relative path is relative to the kubeconfig's directory, as kubectl reads it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::ApiError;

/// The largest kubeconfig, certificate, key or token file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where the API server is and how to prove who this node is.
#[derive(Debug)]
pub struct Kubeconfig {
    /// The server's host (a name, or an IP address without brackets).
    pub host: String,
    /// Its port (443 when the URL names none).
    pub port: u16,
    /// A path prefix of the server URL (usually empty).
    pub prefix: String,
    /// The certificate authorities the server's certificate must chain to.
    pub ca: Vec<CertificateDer<'static>>,
    /// The client certificate chain and key, when the user has one.
    pub client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// The bearer token, when the user has one.
    pub token: Option<String>,
    /// `tls-server-name`: the name the server's certificate is checked against (and sent as
    /// SNI) instead of the host.
    pub server_name: Option<String>,
    /// The files read, each with its identity then.
    sources: Vec<(PathBuf, Identity)>,
}

/// What identifies a file's content without reading it: device, inode, size and modification
/// time. A rotation that renames a new file over the old, points a link at another, or
/// rewrites it in place changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Identity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeconfigFile {
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    users: Vec<NamedUser>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    current_context: Option<String>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    name: String,
    cluster: Cluster,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    #[serde(default)]
    proxy_url: Option<String>,
    #[serde(default)]
    tls_server_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: User,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    #[serde(default)]
    client_certificate: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(default)]
    exec: Option<serde_yaml::Value>,
    #[serde(default, rename = "auth-provider")]
    auth_provider: Option<serde_yaml::Value>,
    #[serde(default)]
    username: Option<serde_yaml::Value>,
    #[serde(default)]
    password: Option<serde_yaml::Value>,
    #[serde(default, rename = "as")]
    impersonate: Option<serde_yaml::Value>,
    #[serde(default)]
    as_uid: Option<serde_yaml::Value>,
    #[serde(default)]
    as_groups: Option<serde_yaml::Value>,
    #[serde(default)]
    as_user_extra: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
struct NamedContext {
    name: String,
    context: Context,
}

#[derive(Debug, Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: Option<String>,
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> ApiError {
    ApiError::Kubeconfig(format!("{}: {why}", path.display()))
}

impl Kubeconfig {
    /// Reads and checks the kubeconfig at `path` and the files it names.
    pub fn read(path: &Path) -> Result<Self, ApiError> {
        let (text, identity) = read_trusted(path, false).map_err(|why| invalid(path, why))?;
        let text = String::from_utf8(text).map_err(|_| invalid(path, "is not UTF-8"))?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        let mut config = Self::parse(&text, dir).map_err(|why| invalid(path, why))?;
        config.sources.insert(0, (path.to_path_buf(), identity));
        Ok(config)
    }

    /// Whether a file this was read from is no longer the one read (rotated, rewritten,
    /// replaced, gone): its identity now, through a link as it was read, differs. A `stat`
    /// of each, no read.
    pub fn changed(&self) -> bool {
        self.sources
            .iter()
            .any(|(path, then)| std::fs::metadata(path).map_or(true, |m| Identity::of(&m) != *then))
    }

    /// The node this kubeconfig's client certificate names: `<name>` of its subject's common
    /// name `system:node:<name>`, as the Node authorizer reads it; `None` without a client
    /// certificate or with another subject.
    pub fn node_name(&self) -> Option<String> {
        let (chain, _) = self.client.as_ref()?;
        let cn = subject_common_name(chain.first()?.as_ref())?;
        cn.strip_prefix("system:node:")
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    }

    /// Whether `other` presents other credentials (client certificate or token).
    pub(crate) fn credentials_differ(&self, other: &Self) -> bool {
        self.client.as_ref().map(|c| &c.0) != other.client.as_ref().map(|c| &c.0)
            || self.token != other.token
    }

    /// Parses a kubeconfig's text; relative paths in it are relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Self, String> {
        let mut sources = Vec::new();
        let mut config = Self::parse_from(text, dir, &mut sources)?;
        config.sources = sources;
        Ok(config)
    }

    fn parse_from(
        text: &str,
        dir: &Path,
        sources: &mut Vec<(PathBuf, Identity)>,
    ) -> Result<Self, String> {
        let file: KubeconfigFile =
            serde_yaml::from_str(text).map_err(|e| format!("not a kubeconfig: {e}"))?;
        let context = match &file.current_context {
            Some(name) if !name.is_empty() => Some(
                file.contexts
                    .iter()
                    .find(|c| &c.name == name)
                    .map(|c| &c.context)
                    .ok_or_else(|| format!("current-context {name:?} is not among its contexts"))?,
            ),
            _ if file.contexts.len() == 1 => Some(&file.contexts[0].context),
            _ => None,
        };
        let cluster = match context {
            Some(c) => file
                .clusters
                .iter()
                .find(|n| n.name == c.cluster)
                .ok_or_else(|| format!("cluster {:?} is not among its clusters", c.cluster))?,
            None if file.clusters.len() == 1 => &file.clusters[0],
            None => return Err("names no current-context and not exactly one cluster".into()),
        };
        let user = match context.and_then(|c| c.user.as_ref()) {
            Some(u) => Some(
                file.users
                    .iter()
                    .find(|n| &n.name == u)
                    .ok_or_else(|| format!("user {u:?} is not among its users"))?,
            ),
            None if file.users.len() == 1 => Some(&file.users[0]),
            None => None,
        };
        let c = &cluster.cluster;
        if c.insecure_skip_tls_verify {
            return Err(format!(
                "cluster {:?} sets insecure-skip-tls-verify, which kata-topo does not accept",
                cluster.name
            ));
        }
        if c.proxy_url.is_some() {
            return Err(format!(
                "cluster {:?} sets a proxy-url, which kata-topo does not use",
                cluster.name
            ));
        }
        let (host, port, prefix) = parse_server(&c.server)?;
        let server_name = match &c.tls_server_name {
            None => None,
            Some(n) if n.is_empty() => None,
            Some(n) => {
                rustls::pki_types::ServerName::try_from(n.as_str()).map_err(|e| {
                    format!(
                        "cluster {:?} has tls-server-name {n:?}, which is not a server name: {e}",
                        cluster.name
                    )
                })?;
                Some(n.clone())
            }
        };
        let ca_pem = match (&c.certificate_authority_data, &c.certificate_authority) {
            (Some(data), _) => decode_data(data, "certificate-authority-data")?,
            (None, Some(file)) => read_named(dir, file, "certificate-authority", sources)?,
            (None, None) => {
                return Err(format!(
                    "cluster {:?} names no certificate-authority: the API server's certificate \
                     could not be checked",
                    cluster.name
                ))
            }
        };
        let ca = certificates(&ca_pem, "certificate-authority")?;
        let mut config = Kubeconfig {
            host,
            port,
            prefix,
            ca,
            client: None,
            token: None,
            server_name,
            sources: Vec::new(),
        };
        let Some(named) = user else {
            return Ok(config);
        };
        let u = &named.user;
        if u.exec.is_some() || u.auth_provider.is_some() {
            return Err(format!(
                "user {:?} authenticates through an exec or auth-provider plugin, which kata-topo \
                 does not run",
                named.name
            ));
        }
        for (key, set) in [("username", &u.username), ("password", &u.password)] {
            if set.is_some() {
                return Err(format!(
                    "user {:?} sets {key} (basic authentication), which the API server no longer \
                     accepts and kata-topo does not send",
                    named.name
                ));
            }
        }
        for (key, set) in [
            ("as", &u.impersonate),
            ("as-uid", &u.as_uid),
            ("as-groups", &u.as_groups),
            ("as-user-extra", &u.as_user_extra),
        ] {
            if set.is_some() {
                return Err(format!(
                    "user {:?} sets {key} (impersonation), which kata-topo does not do: the node \
                     reads as itself",
                    named.name
                ));
            }
        }
        let cert = match (&u.client_certificate_data, &u.client_certificate) {
            (Some(d), _) => Some(decode_data(d, "client-certificate-data")?),
            (None, Some(f)) => Some(read_named(dir, f, "client-certificate", sources)?),
            (None, None) => None,
        };
        let key = match (&u.client_key_data, &u.client_key) {
            (Some(d), _) => Some(decode_data(d, "client-key-data")?),
            (None, Some(f)) => Some(read_named(dir, f, "client-key", sources)?),
            (None, None) => None,
        };
        config.client = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                certificates(&cert, "client-certificate")?,
                PrivateKeyDer::from_pem_slice(&key)
                    .map_err(|e| format!("client-key holds no usable private key: {e}"))?,
            )),
            (None, None) => None,
            _ => {
                return Err(format!(
                    "user {:?} has a client certificate without its key, or a key without its \
                     certificate",
                    named.name
                ))
            }
        };
        config.token = match (&u.token, &u.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(f)) => {
                let t = read_named(dir, f, "tokenFile", sources)?;
                Some(
                    String::from_utf8(t)
                        .map_err(|_| "tokenFile is not UTF-8".to_string())?
                        .trim()
                        .to_string(),
                )
            }
            (None, None) => None,
        }
        .filter(|t| !t.is_empty());
        if let Some(t) = &config.token {
            if t.bytes().any(|b| b.is_ascii_control() || b == b' ') {
                return Err("the token holds spaces or control characters".into());
            }
        }
        Ok(config)
    }
}

/// `https://host[:port][/prefix]`.
fn parse_server(url: &str) -> Result<(String, u16, String), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("server {url:?} is not an https:// URL"))?;
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
        None => (rest, String::new()),
    };
    if authority.contains('@') {
        return Err(format!("server {url:?} carries credentials in its URL"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("server {url:?} has an unclosed IPv6 address"))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(format!("server {url:?} has no usable host"));
    }
    let port = match port {
        None => 443,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("server {url:?} has no usable port"))?,
    };
    if prefix
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#')
    {
        return Err(format!("server {url:?} has an unusable path"));
    }
    Ok((host.to_string(), port, prefix))
}

fn decode_data(data: &str, field: &str) -> Result<Vec<u8>, String> {
    let compact: String = data.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("{field} is not base64: {e}"))
}

fn certificates(pem: &[u8], field: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{field} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{field} holds no certificate"));
    }
    Ok(certs)
}

/// A file the kubeconfig names, relative to its directory; kept in `sources` with its
/// identity.
fn read_named(
    dir: &Path,
    name: &str,
    field: &str,
    sources: &mut Vec<(PathBuf, Identity)>,
) -> Result<Vec<u8>, String> {
    let path = if Path::new(name).is_absolute() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    };
    let (bytes, identity) =
        read_trusted(&path, true).map_err(|why| format!("{field} {}: {why}", path.display()))?;
    sources.push((path, identity));
    Ok(bytes)
}

/// One DER element at the start of `b`: its tag, its contents and what follows it.
fn der(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, mut b) = b.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |l, &x| (l << 8) | usize::from(x));
        b = &b[n..];
        len
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// The common name of an X.509 certificate's subject (the last one, as Go's `pkix.Name`
/// keeps it); `None` when there is none or the DER does not read.
fn subject_common_name(cert: &[u8]) -> Option<String> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, certificate, _) = der(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = der(certificate)? else {
        return None;
    };
    // The explicit version, when there is one.
    if let (0xa0, _, rest) = der(tbs)? {
        tbs = rest;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        tbs = der(tbs)?.2;
    }
    let (SEQUENCE, mut subject, _) = der(tbs)? else {
        return None;
    };
    let mut cn = None;
    while !subject.is_empty() {
        let (set_tag, mut set, rest) = der(subject)?;
        subject = rest;
        if set_tag != 0x31 {
            return None;
        }
        while !set.is_empty() {
            let (SEQUENCE, attribute, rest) = der(set)? else {
                return None;
            };
            set = rest;
            let (0x06, oid, value) = der(attribute)? else {
                return None;
            };
            // 2.5.4.3, commonName: a UTF8String, PrintableString or IA5String.
            if oid == [0x55, 0x04, 0x03] {
                if let (0x0c | 0x13 | 0x16, text, _) = der(value)? {
                    cn = Some(String::from_utf8(text.to_vec()).ok()?);
                }
            }
        }
    }
    cn
}

/// Reads a regular file of this process's user that no one else may write, at most
/// [`MAX_FILE_BYTES`], with the identity of the file read; a symbolic link is followed only
/// when `link_ok` and the link is this user's too.
fn read_trusted(path: &Path, link_ok: bool) -> Result<(Vec<u8>, Identity), String> {
    use kata_topo_core::files::{open_regular, read_to_limit, Symlinks};
    let me = rustix::process::geteuid().as_raw();
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    let symlinks = if meta.file_type().is_symlink() {
        if !link_ok {
            return Err("is a symbolic link, which is not followed".into());
        }
        if meta.uid() != me {
            return Err(format!(
                "is a symbolic link of uid {}, not {me}, which is not followed",
                meta.uid()
            ));
        }
        Symlinks::Follow
    } else {
        Symlinks::Refuse
    };
    let file: File = open_regular(path, symlinks).map_err(|e| e.to_string())?;
    let st = file.metadata().map_err(|e| e.to_string())?;
    if st.uid() != me {
        return Err(format!("belongs to uid {}, not {me}", st.uid()));
    }
    let mode = st.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "may be written by others than its owner (mode {mode:04o})"
        ));
    }
    let identity = Identity::of(&st);
    let bytes = read_to_limit(file, MAX_FILE_BYTES).map_err(|e| e.to_string())?;
    Ok((bytes, identity))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever bytes a certificate holds, looking for its subject never panics.
        #[test]
        fn any_certificate_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = subject_common_name(&bytes);
            let mut seq = vec![0x30, 0x82, 0x01, 0x00];
            seq.extend(&bytes);
            let _ = subject_common_name(&seq);
        }
    }

    #[test]
    fn server_urls() {
        assert_eq!(
            parse_server("https://10.0.2.100:6443"),
            Ok(("10.0.2.100".into(), 6443, String::new()))
        );
        assert_eq!(
            parse_server("https://api.example:8443/k8s/"),
            Ok(("api.example".into(), 8443, "/k8s".into()))
        );
        assert_eq!(
            parse_server("https://[fd00::1]:6443"),
            Ok(("fd00::1".into(), 6443, String::new()))
        );
        assert_eq!(
            parse_server("https://cp.example"),
            Ok(("cp.example".into(), 443, String::new()))
        );
        for bad in [
            "http://10.0.2.100:6443",
            "https://:6443",
            "https://h:0",
            "https://h:99999",
            "https://u:p@h:6443",
            "https://[fd00::1:6443",
            "https://h:6443/a b",
        ] {
            assert!(parse_server(bad).is_err(), "{bad}");
        }
    }
}
