//! The `start` handshake with containerd, decoded in one place with the generated types.
//!
//! In: containerd ≥ 2.3 writes a `BootstrapParams` to `start`'s stdin — instance id, namespace,
//! its ttrpc and gRPC addresses, the shim socket directory, and the runtime options as an
//! extension. containerd ≤ 2.2 writes the runtime options as a bare `google.protobuf.Any`, or
//! nothing; the rest comes from flags and `TTRPC_ADDRESS`. Both are protobuf and look alike on
//! the wire (fields 1 and 2 are strings in both): a message with any field an `Any` cannot
//! have (3–9; containerd 2.3 always sets its version and addresses) is a `BootstrapParams`,
//! anything else is read as an `Any`.
//!
//! Out: the delegate's answer — a plain address (1.6), JSON (1.7–2.2) or a protobuf
//! `BootstrapResult` (2.3+) — is answered in the same format with the wrapper's address.

use std::path::{Path, PathBuf};

use prost::Message;
use prost_types::Any;
use serde::Deserialize;

use crate::containerd::runtime::bootstrap::v1::{BootstrapParams, BootstrapResult, LogLevel};
use crate::runtimeoptions::v1::Options as RuntimeOptions;

/// What a shim's command line (and, for the ttrpc address, its environment) says: the
/// fallback for what containerd ≤ 2.2 does not send on stdin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `-id`.
    pub id: String,
    /// `-namespace`.
    pub namespace: String,
    /// `-address`: containerd's gRPC address.
    pub address: String,
    /// `-publish-binary`.
    pub publish_binary: String,
    /// `-debug`.
    pub debug: bool,
}

/// Where shims put their sockets unless containerd names a directory (containerd hard-codes
/// it before 2.3, whatever its `state` setting).
pub const DEFAULT_SOCKET_DIR: &str = "/run/containerd/s";

/// The runtime options type CRI passes a non-runc shim (Kata's `ConfigPath`).
const RUNTIME_OPTIONS: &str = "runtimeoptions.v1.Options";

/// Why `start`'s input or the delegate's answer could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    /// stdin is neither a `BootstrapParams` nor an `Any`.
    #[error("kata-topo: cannot decode what containerd wrote to start's stdin ({0} bytes): neither BootstrapParams nor runtime options")]
    Stdin(usize),
    /// The runtime options are of Kata's type but do not decode.
    #[error(
        "kata-topo: cannot decode the runtime options ({RUNTIME_OPTIONS}) containerd passed: {0}"
    )]
    Options(String),
    /// The delegate's `start` printed something that is no start reply.
    #[error("kata-topo: cannot understand the delegate's start reply {0:?}")]
    Reply(String),
    /// The bootstrap's `socket_dir` is not an absolute path (the wrapper's daemon runs in
    /// another directory than `start`, and would neither find nor remove its socket).
    #[error("kata-topo: the socket_dir containerd passed ({0:?}) is not an absolute path")]
    SocketDir(String),
    /// The delegate serves a protocol the wrapper cannot forward.
    #[error("kata-topo: the delegate shim serves {0:?}; kata-topo forwards ttrpc only")]
    Protocol(String),
}

/// What containerd wrote to `start`'s stdin.
#[derive(Debug, Clone, PartialEq)]
pub enum Stdin {
    /// Nothing: containerd ≤ 2.2 without runtime options.
    Empty,
    /// A bare runtime-options `Any`: containerd ≤ 2.2.
    Options(Any),
    /// The bootstrap protocol: containerd ≥ 2.3.
    Bootstrap(BootstrapParams),
}

impl Stdin {
    /// Decodes `start`'s stdin.
    pub fn decode(bytes: &[u8]) -> Result<Self, BootstrapError> {
        if bytes.is_empty() {
            return Ok(Self::Empty);
        }
        if let Ok(params) = BootstrapParams::decode(bytes) {
            let beyond_any = params.log_level != 0
                || !params.containerd_version.is_empty()
                || !params.containerd_ttrpc_address.is_empty()
                || !params.containerd_grpc_address.is_empty()
                || !params.containerd_binary.is_empty()
                || !params.extensions.is_empty()
                || params.socket_dir.is_some();
            if beyond_any {
                return Ok(Self::Bootstrap(params));
            }
        }
        Any::decode(bytes)
            .map(Self::Options)
            .map_err(|_| BootstrapError::Stdin(bytes.len()))
    }

    /// The runtime options' `ConfigPath`, when containerd passed Kata's options type with one.
    pub fn config_path(&self) -> Result<Option<PathBuf>, BootstrapError> {
        let options: Vec<&Any> = match self {
            Self::Empty => Vec::new(),
            Self::Options(any) => vec![any],
            Self::Bootstrap(params) => params
                .extensions
                .iter()
                .filter_map(|e| e.value.as_ref())
                .collect(),
        };
        for any in options
            .into_iter()
            .filter(|a| is_runtime_options(&a.type_url))
        {
            let opts = RuntimeOptions::decode(any.value.as_slice())
                .map_err(|e| BootstrapError::Options(e.to_string()))?;
            if !opts.config_path.is_empty() {
                return Ok(Some(PathBuf::from(opts.config_path)));
            }
        }
        Ok(None)
    }

    /// The bootstrap parameters, when containerd sent them.
    pub fn params(&self) -> Option<&BootstrapParams> {
        match self {
            Self::Bootstrap(p) => Some(p),
            Self::Empty | Self::Options(_) => None,
        }
    }
}

/// `runtimeoptions.v1.Options`, bare or behind a type URL prefix.
fn is_runtime_options(type_url: &str) -> bool {
    type_url == RUNTIME_OPTIONS || type_url.ends_with(&format!("/{RUNTIME_OPTIONS}"))
}

/// What `start` works with: the bootstrap's values where containerd sent them; the command
/// line and `TTRPC_ADDRESS` otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartParams {
    /// The task (or sandbox) id.
    pub instance_id: String,
    /// The containerd namespace.
    pub namespace: String,
    /// containerd's gRPC address (shims name their sockets after it).
    pub grpc_address: String,
    /// containerd's ttrpc address, where events are published.
    pub ttrpc_address: String,
    /// The containerd binary (`-publish-binary`).
    pub containerd_binary: String,
    /// The directory for the wrapper's socket.
    pub socket_dir: PathBuf,
    /// Debug logging.
    pub debug: bool,
    /// The runtime options' `ConfigPath`.
    pub config_path: Option<PathBuf>,
    /// `BootstrapParams` from containerd VERSION, or `legacy`: for the log.
    pub protocol: String,
}

impl StartParams {
    /// Combines stdin with the command line and the environment's `TTRPC_ADDRESS`.
    pub fn resolve(
        stdin: &Stdin,
        args: &Flags,
        ttrpc_env: Option<String>,
    ) -> Result<Self, BootstrapError> {
        let config_path = stdin.config_path()?;
        let pick = |from_params: Option<&String>, fallback: &str| {
            from_params
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| fallback.to_string())
        };
        let p = stdin.params();
        let ttrpc_env = ttrpc_env.unwrap_or_default();
        let socket_dir = PathBuf::from(pick(
            p.and_then(|p| p.socket_dir.as_ref()),
            DEFAULT_SOCKET_DIR,
        ));
        if !socket_dir.is_absolute() {
            return Err(BootstrapError::SocketDir(
                socket_dir.to_string_lossy().into_owned(),
            ));
        }
        Ok(Self {
            instance_id: pick(p.map(|p| &p.instance_id), &args.id),
            namespace: pick(p.map(|p| &p.namespace), &args.namespace),
            grpc_address: pick(p.map(|p| &p.containerd_grpc_address), &args.address),
            ttrpc_address: pick(p.map(|p| &p.containerd_ttrpc_address), &ttrpc_env),
            containerd_binary: pick(p.map(|p| &p.containerd_binary), &args.publish_binary),
            socket_dir,
            debug: match p {
                Some(p) => p.log_level <= LogLevel::Debug as i32,
                None => args.debug,
            },
            config_path,
            protocol: match p {
                Some(p) => format!("BootstrapParams from containerd {}", p.containerd_version),
                None => "legacy".to_string(),
            },
        })
    }

    /// The socket directory as a path.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }
}

/// How the delegate answered `start`, so the wrapper answers the same way.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A plain `unix://` address (containerd 1.6).
    Plain,
    /// JSON `{"version":N,"address":…,"protocol":…}` (1.7–2.2).
    Json {
        /// Task API version.
        version: u32,
        /// `ttrpc`.
        protocol: String,
    },
    /// A protobuf `BootstrapResult` (2.3+), kept whole but for the address.
    Bootstrap(BootstrapResult),
}

impl Reply {
    /// Parses the delegate's stdout: the format, the delegate's address and its task API
    /// version.
    pub fn parse(out: &[u8]) -> Result<(Self, String, u32), BootstrapError> {
        let shown =
            || BootstrapError::Reply(String::from_utf8_lossy(out).chars().take(200).collect());
        let ttrpc_only = |protocol: &str| {
            if protocol.is_empty() || protocol == "ttrpc" {
                Ok(())
            } else {
                Err(BootstrapError::Protocol(protocol.to_string()))
            }
        };
        if let Ok(text) = std::str::from_utf8(out) {
            let text = text.trim();
            if text.starts_with("unix://") || text.starts_with('/') {
                return Ok((Self::Plain, text.to_string(), 2));
            }
            if text.starts_with('{') {
                #[derive(Deserialize)]
                struct J {
                    version: u32,
                    address: String,
                    #[serde(default)]
                    protocol: String,
                }
                let j: J = serde_json::from_str(text).map_err(|_| shown())?;
                ttrpc_only(&j.protocol)?;
                return Ok((
                    Self::Json {
                        version: j.version,
                        protocol: j.protocol,
                    },
                    j.address,
                    j.version,
                ));
            }
        }
        let result = BootstrapResult::decode(out).map_err(|_| shown())?;
        if result.address.is_empty() {
            return Err(shown());
        }
        ttrpc_only(&result.protocol)?;
        let (address, version) = (result.address.clone(), result.version.max(0) as u32);
        Ok((Self::Bootstrap(result), address, version))
    }

    /// The same reply with the wrapper's address.
    pub fn encode(&self, address: &str) -> Vec<u8> {
        match self {
            Self::Plain => address.as_bytes().to_vec(),
            Self::Json { version, protocol } => serde_json::json!({
                "version": version, "address": address, "protocol": protocol
            })
            .to_string()
            .into_bytes(),
            Self::Bootstrap(result) => BootstrapResult {
                address: address.to_string(),
                ..result.clone()
            }
            .encode_to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd::runtime::bootstrap::v1::Extension;

    /// The flags of a shim command line such as `-namespace ns -id t1 -debug start`.
    fn args(s: &str) -> Flags {
        let mut f = Flags::default();
        let mut words = s.split_whitespace();
        while let Some(w) = words.next() {
            let mut value = || words.next().unwrap_or_default().to_string();
            match w {
                "-id" => f.id = value(),
                "-namespace" => f.namespace = value(),
                "-address" => f.address = value(),
                "-publish-binary" => f.publish_binary = value(),
                "-debug" => f.debug = true,
                _ => {}
            }
        }
        f
    }

    fn kata_options(path: &str) -> Any {
        Any {
            type_url: RUNTIME_OPTIONS.into(),
            value: RuntimeOptions {
                type_url: "io.containerd.kata.v2".into(),
                config_path: path.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        }
    }

    /// A recording of real containerd (`tests/fixtures/bootstrap/README.md`).
    fn recorded(version: &str, name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/bootstrap")
            .join(format!("containerd-{version}"))
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The `ConfigPath` the recordings were made with.
    const RECORDED: &str = "/opt/kata/share/defaults/kata-containers/configuration-kata-topo.toml";

    fn is_shim_socket(address: &str, dir: &str) -> bool {
        address
            .strip_prefix(&format!("unix://{dir}/"))
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    #[test]
    fn containerd_1_6_writes_a_bare_any_and_reads_a_plain_address() {
        let flags = args("-namespace k8s.io -address /c.sock -id sb1 start");
        let without =
            Stdin::decode(&recorded("1.6.20", "without-configpath.stdin")).expect("decodes");
        assert_eq!(without, Stdin::Empty);
        let p = StartParams::resolve(&without, &flags, Some("/c.sock.ttrpc".into())).expect("p");
        assert_eq!((p.config_path, p.instance_id.as_str()), (None, "sb1"));
        assert_eq!(p.socket_dir, Path::new(DEFAULT_SOCKET_DIR));

        let with = Stdin::decode(&recorded("1.6.20", "with-configpath.stdin")).expect("decodes");
        let Stdin::Options(any) = &with else {
            panic!("a bare Any: {with:?}")
        };
        assert_eq!(any.type_url, RUNTIME_OPTIONS);
        let p = StartParams::resolve(&with, &flags, None).expect("p");
        assert_eq!(p.config_path, Some(PathBuf::from(RECORDED)));
        assert_eq!(
            (p.namespace.as_str(), p.protocol.as_str()),
            ("k8s.io", "legacy")
        );

        let (reply, address, version) =
            Reply::parse(&recorded("1.6.20", "without-configpath.stdout")).expect("reply");
        assert_eq!((&reply, version), (&Reply::Plain, 2));
        assert!(is_shim_socket(&address, DEFAULT_SOCKET_DIR), "{address}");
        assert_eq!(
            reply.encode("unix:///run/containerd/s/ours"),
            b"unix:///run/containerd/s/ours"
        );
    }

    #[test]
    fn containerd_2_3_writes_bootstrap_params_and_reads_a_bootstrap_result() {
        // Flags that disagree with the bootstrap: the bootstrap wins.
        let flags = args("-namespace flagged -address /flag.sock -id flag-id start");
        for name in ["without-configpath", "with-configpath"] {
            let bytes = recorded("2.3.4", &format!("{name}.stdin"));
            let input = Stdin::decode(&bytes).expect("decodes");
            let params = input.params().expect("BootstrapParams").clone();
            let p = StartParams::resolve(&input, &flags, Some("/env.ttrpc".into())).expect("p");
            assert_eq!(p.instance_id, params.instance_id);
            assert_eq!(p.instance_id.len(), 64, "a CRI sandbox id");
            assert_eq!(p.namespace, "k8s.io");
            assert!(params.containerd_version.starts_with("2.3.4"), "{params:?}");
            assert!(p
                .protocol
                .starts_with("BootstrapParams from containerd 2.3.4"));
            assert!(p.grpc_address.ends_with("/c.sock"), "{p:?}");
            assert_eq!(p.ttrpc_address, format!("{}.ttrpc", p.grpc_address));
            assert!(p.containerd_binary.ends_with("/bin/containerd"), "{p:?}");
            let socket_dir = params.socket_dir.clone().expect("socket_dir");
            assert_eq!(p.socket_dir, Path::new(&socket_dir));
            assert!(!p.debug);
            let expected = (name == "with-configpath").then(|| PathBuf::from(RECORDED));
            assert_eq!(p.config_path, expected, "{name}");
            // What `start` did before it knew the bootstrap: the bytes read as an Any put the
            // instance id in the type URL and lost ConfigPath.
            let as_any = Any::decode(bytes.as_slice()).expect("an Any on the wire");
            assert_eq!(as_any.type_url, params.instance_id);
            assert_eq!(
                Stdin::Options(as_any).config_path().expect("no options"),
                None
            );

            let stdout = recorded("2.3.4", &format!("{name}.stdout"));
            let (reply, address, version) = Reply::parse(&stdout).expect("reply");
            assert_eq!(version, 3);
            assert!(is_shim_socket(&address, &socket_dir), "{address}");
            let Reply::Bootstrap(result) = &reply else {
                panic!("a BootstrapResult: {reply:?}")
            };
            assert_eq!(result.protocol, "ttrpc");
            let ours = BootstrapResult::decode(reply.encode("unix:///s/ours").as_slice())
                .expect("our reply");
            assert_eq!(
                ours,
                BootstrapResult {
                    address: "unix:///s/ours".into(),
                    ..result.clone()
                }
            );
        }
    }

    proptest::proptest! {
        /// Whatever containerd or a delegate writes: a decision or an error, never a panic.
        #[test]
        fn any_input_decodes_or_fails_cleanly(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            if let Ok(input) = Stdin::decode(&bytes) {
                let _ = StartParams::resolve(&input, &Flags::default(), None);
            }
            if let Ok((reply, _, _)) = Reply::parse(&bytes) {
                let _ = Reply::parse(&reply.encode("unix:///run/containerd/s/x"));
            }
        }
    }

    #[test]
    fn legacy_stdin_is_an_any_or_nothing() {
        assert_eq!(Stdin::decode(b"").expect("empty"), Stdin::Empty);
        let any = kata_options("/opt/kata/configuration.toml");
        let stdin = Stdin::decode(&any.encode_to_vec()).expect("any");
        assert_eq!(stdin, Stdin::Options(any));
        assert_eq!(
            stdin.config_path().expect("options"),
            Some(PathBuf::from("/opt/kata/configuration.toml"))
        );
        // runc's options are not Kata's: no ConfigPath, no error.
        let runc = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: vec![0x08, 0x01],
        };
        let stdin = Stdin::decode(&runc.encode_to_vec()).expect("any");
        assert_eq!(stdin.config_path().expect("other options"), None);
        // A type URL with a prefix names the same type.
        let prefixed = Any {
            type_url: format!("type.googleapis.com/{RUNTIME_OPTIONS}"),
            ..kata_options("/k.toml")
        };
        assert_eq!(
            Stdin::decode(&prefixed.encode_to_vec())
                .expect("any")
                .config_path()
                .expect("options"),
            Some(PathBuf::from("/k.toml"))
        );
    }

    #[test]
    fn bootstrap_params_carry_options_in_extensions() {
        let params = BootstrapParams {
            instance_id: "task1".into(),
            namespace: "k8s.io".into(),
            containerd_version: "2.3.4".into(),
            containerd_ttrpc_address: "/run/containerd/containerd.sock.ttrpc".into(),
            containerd_grpc_address: "/run/containerd/containerd.sock".into(),
            containerd_binary: "/usr/bin/containerd".into(),
            extensions: vec![
                Extension {
                    value: Some(Any {
                        type_url: "containerd.io/cri.v1.Other".into(),
                        value: vec![],
                    }),
                },
                Extension {
                    value: Some(kata_options("/etc/kata/kt.toml")),
                },
            ],
            socket_dir: Some("/run/k/s".into()),
            ..Default::default()
        };
        let stdin = Stdin::decode(&params.encode_to_vec()).expect("bootstrap");
        assert!(matches!(stdin, Stdin::Bootstrap(_)));
        let p = StartParams::resolve(
            &stdin,
            &args(
                "-namespace flagns -address /flag.sock -id flagid -publish-binary /flagbin start",
            ),
            Some("/env.ttrpc".into()),
        )
        .expect("resolve");
        assert_eq!(p.instance_id, "task1");
        assert_eq!(p.namespace, "k8s.io");
        assert_eq!(p.grpc_address, "/run/containerd/containerd.sock");
        assert_eq!(p.ttrpc_address, "/run/containerd/containerd.sock.ttrpc");
        assert_eq!(p.containerd_binary, "/usr/bin/containerd");
        assert_eq!(p.socket_dir, Path::new("/run/k/s"));
        assert_eq!(p.config_path, Some(PathBuf::from("/etc/kata/kt.toml")));
        assert!(!p.debug, "log level INFO");
        assert_eq!(p.protocol, "BootstrapParams from containerd 2.3.4");
    }

    #[test]
    fn a_relative_socket_dir_is_refused() {
        for dir in ["run/k/s", "./s", "s"] {
            let params = BootstrapParams {
                instance_id: "t1".into(),
                containerd_version: "2.3.4".into(),
                socket_dir: Some(dir.into()),
                ..Default::default()
            };
            let stdin = Stdin::decode(&params.encode_to_vec()).expect("bootstrap");
            let e = StartParams::resolve(&stdin, &args("-namespace ns -id t1 start"), None)
                .expect_err("a relative socket_dir");
            assert_eq!(e, BootstrapError::SocketDir(dir.into()));
            let text = e.to_string();
            assert!(
                text.contains(&format!("{dir:?}")) && text.contains("absolute"),
                "{text}"
            );
        }
    }

    #[test]
    fn flags_and_environment_are_the_fallback() {
        let p = StartParams::resolve(
            &Stdin::Empty,
            &args(
                "-namespace default -address /c.sock -id t1 -publish-binary /bin/ctrd -debug start",
            ),
            Some("/c.sock.ttrpc".into()),
        )
        .expect("resolve");
        assert_eq!(
            (
                p.instance_id.as_str(),
                p.namespace.as_str(),
                p.grpc_address.as_str()
            ),
            ("t1", "default", "/c.sock")
        );
        assert_eq!(p.ttrpc_address, "/c.sock.ttrpc");
        assert_eq!(p.socket_dir, Path::new(DEFAULT_SOCKET_DIR));
        assert!(p.debug);
        assert_eq!(p.config_path, None);
        assert_eq!(p.protocol, "legacy");
        // Bootstrap fields left empty fall back one by one; a debug log level is honoured.
        let partial = BootstrapParams {
            instance_id: "t2".into(),
            containerd_version: "2.3.0".into(),
            log_level: LogLevel::Debug as i32,
            ..Default::default()
        };
        let p = StartParams::resolve(
            &Stdin::decode(&partial.encode_to_vec()).expect("bootstrap"),
            &args("-namespace ns -address /a.sock -id t1 start"),
            None,
        )
        .expect("resolve");
        assert_eq!(
            (
                p.instance_id.as_str(),
                p.namespace.as_str(),
                p.ttrpc_address.as_str()
            ),
            ("t2", "ns", "")
        );
        assert!(p.debug);
    }

    #[test]
    fn undecodable_input_is_an_error_never_a_silent_default() {
        assert_eq!(Stdin::decode(&[0xff, 0xff]), Err(BootstrapError::Stdin(2)));
        assert_eq!(
            Stdin::decode(b"{\"json\":1}"),
            Err(BootstrapError::Stdin(10))
        );
        let broken = Any {
            type_url: RUNTIME_OPTIONS.into(),
            value: vec![0x12, 0x40, b'/'],
        };
        let e = Stdin::decode(&broken.encode_to_vec())
            .expect("an any")
            .config_path()
            .expect_err("options that do not decode");
        assert!(matches!(e, BootstrapError::Options(_)), "{e}");
    }

    #[test]
    fn parses_and_answers_every_reply_format() {
        let (r, a, v) = Reply::parse(b"unix:///run/containerd/s/abc\n").expect("plain");
        assert_eq!(
            (r.clone(), a.as_str(), v),
            (Reply::Plain, "unix:///run/containerd/s/abc", 2)
        );
        assert_eq!(
            r.encode("unix:///run/containerd/s/me"),
            b"unix:///run/containerd/s/me"
        );

        let (r, a, v) =
            Reply::parse(br#"{"version":3,"address":"unix:///run/x","protocol":"ttrpc"}"#)
                .expect("json");
        assert_eq!((a.as_str(), v), ("unix:///run/x", 3));
        let out: serde_json::Value = serde_json::from_slice(&r.encode("unix:///me")).expect("json");
        assert_eq!(
            out,
            serde_json::json!({"version": 3, "address": "unix:///me", "protocol": "ttrpc"})
        );

        let result = BootstrapResult {
            version: 3,
            address: "unix:///run/d".into(),
            protocol: "ttrpc".into(),
            capabilities: vec![0],
            metadata: [("k".to_string(), "v".to_string())].into(),
        };
        let (r, a, v) = Reply::parse(&result.encode_to_vec()).expect("protobuf");
        assert_eq!((a.as_str(), v), ("unix:///run/d", 3));
        let mine = BootstrapResult::decode(r.encode("unix:///run/me").as_slice()).expect("ours");
        assert_eq!(
            mine,
            BootstrapResult {
                address: "unix:///run/me".into(),
                ..result
            }
        );

        assert!(Reply::parse(b"nonsense").is_err());
        assert!(Reply::parse(b"{\"version\":\"x\"}").is_err());
        assert!(Reply::parse(&[0xff, 0xff, 0xff]).is_err());
        assert!(Reply::parse(b"").is_err(), "no address");
        let grpc = BootstrapResult {
            version: 3,
            address: "unix:///run/g".into(),
            protocol: "grpc".into(),
            ..Default::default()
        };
        assert_eq!(
            Reply::parse(&grpc.encode_to_vec()),
            Err(BootstrapError::Protocol("grpc".into()))
        );
        assert_eq!(
            Reply::parse(br#"{"version":3,"address":"unix:///g","protocol":"grpc"}"#),
            Err(BootstrapError::Protocol("grpc".into()))
        );
    }
}
