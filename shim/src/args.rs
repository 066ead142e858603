//! The command line containerd gives a shim (Go `flag` syntax: `-name value` or `-name=value`),
//! kept whole so it can be handed to the delegate unchanged.

/// What containerd asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start (or reuse) the shim for a task and print its address.
    Start,
    /// Clean up after a task whose shim is gone.
    Delete,
    /// Run as the wrapper daemon (started by `start`; not for containerd).
    Daemon,
    /// Wait for an exiting delegate and remove what it leaves (started by `delete`).
    Reap,
    /// `-v`: print the version.
    Version,
    /// Anything else (`-info`, a future action): handed to the delegate.
    Other,
}

/// Parsed arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    /// Every argument, as received (without argv\[0\]).
    pub raw: Vec<String>,
    /// `-namespace`.
    pub namespace: String,
    /// `-address` (containerd's gRPC socket).
    pub address: String,
    /// `-publish-binary`.
    pub publish_binary: String,
    /// `-id`.
    pub id: String,
    /// `-bundle`.
    pub bundle: String,
    /// `-debug`.
    pub debug: bool,
    /// Daemon only: the listening socket's fd.
    pub listen_fd: Option<i32>,
    /// Daemon only: the configuration file `start` resolved ("" for defaults).
    pub config: String,
    /// Daemon only: the group (pod) this daemon serves.
    pub group: String,
    /// Reaper only: what to clean up once the delegate exited (JSON).
    pub reap: String,
    /// Daemon only: where the configuration came from (`ConfigPath`, `KATA_TOPO_CONFIG`, …).
    pub config_source: String,
    /// Daemon only: containerd's ttrpc address for events, as `start` resolved it.
    pub ttrpc_address: String,
    /// The positional action word, if any.
    pub action_word: Option<String>,
}

/// Why the command line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A flag that takes a value came last.
    #[error("flag -{0} needs a value")]
    MissingValue(String),
    /// A value that should be a number is not.
    #[error("flag -{0} needs a number, not {1:?}")]
    NotANumber(String, String),
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ArgsError> {
    value
        .parse()
        .map_err(|_| ArgsError::NotANumber(name.to_string(), value.to_string()))
}

impl Args {
    /// The flags the start handshake falls back on when containerd sends no bootstrap.
    pub fn flags(&self) -> kata_topo_proto::bootstrap::Flags {
        kata_topo_proto::bootstrap::Flags {
            id: self.id.clone(),
            namespace: self.namespace.clone(),
            address: self.address.clone(),
            publish_binary: self.publish_binary.clone(),
            debug: self.debug,
        }
    }
}

impl Args {
    /// Parses argv (without argv\[0\]). Unknown flags are kept in `raw` for the delegate.
    pub fn parse(argv: &[String]) -> Result<Self, ArgsError> {
        let mut a = Self {
            raw: argv.to_vec(),
            ..Self::default()
        };
        let mut i = 0;
        while i < argv.len() {
            let arg = &argv[i];
            i += 1;
            let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                a.action_word.get_or_insert_with(|| arg.clone());
                continue;
            };
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (flag, None),
            };
            let takes_value = matches!(
                name,
                "namespace"
                    | "address"
                    | "publish-binary"
                    | "id"
                    | "bundle"
                    | "socket"
                    | "listen-fd"
                    | "config"
                    | "config-source"
                    | "ttrpc-address"
                    | "group"
                    | "reap"
            );
            let value = if takes_value {
                match inline.clone() {
                    Some(v) => v,
                    None => {
                        let v = argv
                            .get(i)
                            .ok_or_else(|| ArgsError::MissingValue(name.to_string()))?;
                        i += 1;
                        v.clone()
                    }
                }
            } else {
                String::new()
            };
            match name {
                "namespace" => a.namespace = value,
                "address" => a.address = value,
                "publish-binary" => a.publish_binary = value,
                "id" => a.id = value,
                "bundle" => a.bundle = value,
                "debug" => a.debug = inline.as_deref() != Some("false"),
                "listen-fd" => a.listen_fd = Some(number(name, &value)?),
                "config" => a.config = value,
                "group" => a.group = value,
                "reap" => a.reap = value,
                "config-source" => a.config_source = value,
                "ttrpc-address" => a.ttrpc_address = value,
                "v" | "version" => {
                    a.action_word.get_or_insert_with(|| "-v".to_string());
                }
                _ => {}
            }
        }
        Ok(a)
    }

    pub fn action(&self) -> Action {
        match self.action_word.as_deref() {
            Some("start") => Action::Start,
            Some("delete") => Action::Delete,
            Some("kata-topo-daemon") => Action::Daemon,
            Some("kata-topo-reap") => Action::Reap,
            Some("-v") => Action::Version,
            _ => Action::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Args {
        Args::parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>()).expect("parse")
    }

    #[test]
    fn parses_containerd_start_and_delete() {
        let a = parse("-namespace k8s.io -address /run/containerd/containerd.sock -publish-binary /usr/bin/containerd -id abc -debug start");
        assert_eq!(a.action(), Action::Start);
        assert_eq!(a.namespace, "k8s.io");
        assert_eq!(a.address, "/run/containerd/containerd.sock");
        assert_eq!(a.id, "abc");
        assert!(a.debug);
        let d =
            parse("-namespace default -address /a -publish-binary /b -id t2 -bundle /x/t2 delete");
        assert_eq!(d.action(), Action::Delete);
        assert_eq!(d.bundle, "/x/t2");
        assert!(!d.debug);
        assert_eq!(d.raw.len(), 11);
        assert_eq!(parse("-namespace=ns -id=x start").namespace, "ns");
        assert_eq!(parse("-v").action(), Action::Version);
        assert_eq!(parse("-info").action(), Action::Other);
        let daemon = parse(
            "-namespace n -id t -group g -listen-fd 3 -config /c.toml -config-source ConfigPath \
             -ttrpc-address /c.sock.ttrpc kata-topo-daemon",
        );
        assert_eq!(daemon.action(), Action::Daemon);
        assert_eq!(
            (
                daemon.listen_fd,
                daemon.group.as_str(),
                daemon.config.as_str()
            ),
            (Some(3), "g", "/c.toml")
        );
        assert_eq!(daemon.config_source, "ConfigPath");
        assert_eq!(daemon.ttrpc_address, "/c.sock.ttrpc");
    }

    #[test]
    fn rejects_bad_flags() {
        let argv: Vec<String> = vec!["-id".into()];
        assert_eq!(
            Args::parse(&argv),
            Err(ArgsError::MissingValue("id".into()))
        );
        let argv: Vec<String> = vec!["-listen-fd".into(), "three".into()];
        assert!(matches!(Args::parse(&argv), Err(ArgsError::NotANumber(..))));
    }
}
