//! The plugin's life beside the kubelet: scan, serve the plugin's socket, register, and
//! register again whenever the kubelet restarts.
//!
//! A restarting kubelet deletes every socket in its device plugin directory and creates a new
//! `kubelet.sock`; plugins notice their own socket is gone, serve a new one and register again
//! (the pattern of the kubelet's own sample plugin). This plugin checks both sockets every
//! [`Config::poll`] by identity (device, inode and change time): its own gone or replaced means serve anew
//! and register; a `kubelet.sock` other than the one it registered with means register again.
//! Until the kubelet accepts, registration is retried every [`Config::register_retry`]; the
//! plugin keeps serving and scanning meanwhile, so a kubelet that starts later finds it.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use hyper_util::rt::TokioIo;
use kata_topo_core::Sysfs;
use serde_json::json;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server, Uri};

use crate::api;
use crate::config::Config;
use crate::log::Log;
use crate::plugin::{Change, Inventory, Plugin};
use crate::scan::{error_chain, scan, Scan, ScanError, Skipped};

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The first scan failed: the sysfs root is wrong.
    #[error("cannot scan {root} for VFIO devices")]
    Scan {
        /// The sysfs root.
        root: PathBuf,
        /// Why.
        #[source]
        source: ScanError,
    },
    /// The plugin's socket could not be served.
    #[error("cannot serve the device plugin socket {path}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Something at the socket's path that the plugin did not put there.
    #[error("{0} exists and is not a socket: not replacing it")]
    NotASocket(PathBuf),
    /// The lock that makes one instance per socket could not be taken or waited for.
    #[error("cannot take the instance lock {path}")]
    Lock {
        /// The lock directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Why one registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The kubelet's socket does not answer.
    #[error("cannot connect to the kubelet at {socket}")]
    Connect {
        /// The kubelet's socket.
        socket: PathBuf,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet answered with an error.
    #[error("the kubelet refused the registration ({code:?}): {message}")]
    Refused {
        /// The gRPC code.
        code: tonic::Code,
        /// The kubelet's message.
        message: String,
    },
    /// The kubelet did not answer in time.
    #[error("the kubelet did not answer the registration within {0:?}")]
    Timeout(std::time::Duration),
}

/// The request the plugin registers with.
pub fn register_request(config: &Config) -> api::RegisterRequest {
    api::RegisterRequest {
        version: api::VERSION.into(),
        endpoint: config.socket_name.to_string(),
        resource_name: config.resource_name.to_string(),
        options: Some(Plugin::options()),
    }
}

/// Registers with the kubelet at `<plugin_dir>/kubelet.sock`.
pub async fn register(config: &Config) -> Result<(), RegisterError> {
    let socket = config.plugin_dir.join(api::KUBELET_SOCKET);
    let timeout = config.register_timeout;
    let channel = connect(&socket, timeout)
        .await
        .map_err(|source| RegisterError::Connect {
            socket: socket.clone(),
            source,
        })?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    match tokio::time::timeout(timeout, client.register(register_request(config))).await {
        Err(_) => Err(RegisterError::Timeout(timeout)),
        Ok(Err(status)) => Err(RegisterError::Refused {
            code: status.code(),
            message: status.message().chars().take(512).collect(),
        }),
        Ok(Ok(_)) => Ok(()),
    }
}

/// A gRPC channel over a unix socket (the URI is a placeholder: the connector dials the path).
pub async fn connect(
    socket: &Path,
    timeout: std::time::Duration,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Which file a path names: device, inode and change time (a socket made again at once can
/// get the inode just freed), without following a link; `None` when it is not there.
type Identity = (u64, u64, i64, i64);

fn identity(path: &Path) -> Option<Identity> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One served socket.
struct Serving {
    path: PathBuf,
    identity: Identity,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Serving {
    fn start(
        config: &Config,
        sysfs: &Sysfs,
        inventory: &watch::Receiver<Inventory>,
    ) -> Result<Self, RunError> {
        let path = config.plugin_dir.join(config.socket_name.as_str());
        let io = |source| RunError::Socket {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&path).map_err(io)?,
            Ok(_) => return Err(RunError::NotASocket(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = UnixListener::bind(&path).map_err(io)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        let identity = identity(&path).ok_or_else(|| {
            io(io::Error::new(
                io::ErrorKind::NotFound,
                "the socket vanished as it was made",
            ))
        })?;
        let (stop, stopped) = watch::channel(false);
        let plugin = Plugin::new(
            sysfs.clone(),
            config.resource_name.clone(),
            inventory.clone(),
            stopped.clone(),
        );
        let mut signal = stopped;
        let task = tokio::spawn(
            Server::builder()
                .add_service(api::device_plugin_server::DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = signal.wait_for(|s| *s).await;
                }),
        );
        Ok(Self {
            path,
            identity,
            stop,
            task,
        })
    }

    fn still_there(&self) -> bool {
        identity(&self.path) == Some(self.identity)
    }

    /// Stops serving (open streams end) and removes the socket if it is still the one served.
    async fn stop(self, log: &Log) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        match tokio::time::timeout(std::time::Duration::from_secs(5), &mut task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => log.warn(
                "serve-failed",
                "the device plugin socket stopped with an error",
                json!({"socket": self.path, "error": error_chain(&e)}),
            ),
            Ok(Err(e)) => log.warn(
                "serve-failed",
                "the device plugin server ended abnormally",
                json!({"socket": self.path, "error": e.to_string()}),
            ),
            Err(_) => task.abort(),
        }
        if identity(&self.path) == Some(self.identity) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

async fn scan_now(sysfs: &Sysfs, config: &Config) -> Result<Scan, ScanError> {
    let (sysfs, ids) = (sysfs.clone(), config.ids.clone());
    match tokio::task::spawn_blocking(move || scan(&sysfs, &ids)).await {
        Ok(result) => result,
        Err(e) => Err(ScanError::Unfinished(e.to_string())),
    }
}

fn log_skipped(log: &Log, skipped: &[Skipped]) {
    for s in skipped {
        log.warn(
            "device-skipped",
            "a device was not advertised",
            json!({"device": s.device, "why": s.why}),
        );
    }
}

fn log_changes(log: &Log, inventory: &Inventory, changes: &[Change]) {
    for change in changes {
        let (event, msg, bdf) = match *change {
            Change::Added(b) => ("device-added", "advertising a VFIO device", b),
            Change::Healthy(b) => ("device-healthy", "a device is bound to vfio-pci again", b),
            Change::Unhealthy(b) => (
                "device-unhealthy",
                "a device is no longer bound to vfio-pci: advertised as Unhealthy",
                b,
            ),
            Change::Changed(b) => ("device-changed", "a device's NUMA node or group changed", b),
        };
        let entry = inventory.get(&bdf.to_string());
        log.info(
            event,
            msg,
            json!({
                "device": bdf.to_string(),
                "numa_node": entry.and_then(|e| e.device.numa_node),
                "iommu_group": entry.map(|e| e.device.iommu_group.clone()),
            }),
        );
    }
}

/// Runs the plugin until `shutdown` resolves: scans, serves, registers, follows the kubelet's
/// restarts. Errors only when it cannot start (sysfs root, socket directory); later failures
/// are logged and retried.
pub async fn run(
    config: Config,
    log: Log,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    tokio::pin!(shutdown);
    // Held until `run` returns: the one instance serving this socket on the node.
    let Some(_instance) = one_instance(&config, &log, &mut shutdown).await? else {
        log.info("stopped", "kata-topo device plugin stopped", json!({}));
        return Ok(());
    };
    let sysfs = Sysfs::new(&config.sysfs_root);
    let first = scan_now(&sysfs, &config)
        .await
        .map_err(|source| RunError::Scan {
            root: config.sysfs_root.clone(),
            source,
        })?;
    let mut inventory = Inventory::default();
    let changes = inventory.update(&first.devices);
    log_skipped(&log, &first.skipped);
    log_changes(&log, &inventory, &changes);
    log.info(
        "started",
        "kata-topo device plugin started",
        json!({
            "version": kata_topo_core::VERSION,
            "resource_name": config.resource_name.to_string(),
            "devices": first.devices.len(),
            "sysfs_root": config.sysfs_root,
            "socket": config.plugin_dir.join(config.socket_name.as_str()),
        }),
    );
    let (inventory_tx, inventory_rx) = watch::channel(inventory);
    let scanner = tokio::spawn(rescan(
        config.clone(),
        sysfs.clone(),
        log.clone(),
        inventory_tx,
        first.skipped,
    ));
    let result = serve(&config, &sysfs, &log, &inventory_rx, shutdown).await;
    scanner.abort();
    result
}

/// The instance lock of this plugin's socket: the directory `.<socket name>.lock` in the
/// device plugin directory, `flock`ed. A directory because the kubelet, at each start,
/// removes every file there (the plugins' sockets) but no directory; a lock file would be
/// removed with them, and two instances could each lock their own.
pub fn lock_path(config: &Config) -> PathBuf {
    config
        .plugin_dir
        .join(format!(".{}.lock", config.socket_name.as_str()))
}

/// Takes the instance lock, or waits for it: a second instance for the same socket on the node
/// (the systemd unit and the DaemonSet both running) says so once and waits, trying again
/// every [`Config::register_retry`], until the first stops; it then serves. Without this the
/// two replaced each other's socket every second, each taking the other's for a kubelet
/// restart. `None` when `shutdown` came while waiting.
async fn one_instance<F: Future<Output = ()>>(
    config: &Config,
    log: &Log,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Result<Option<kata_topo_core::files::Dir>, RunError> {
    let path = lock_path(config);
    let mut waiting = false;
    loop {
        match try_lock(&path) {
            Ok(Some(dir)) => {
                if waiting {
                    log.info(
                        "instance-lock-taken",
                        "the other instance stopped: this one serves now",
                        json!({"lock": path}),
                    );
                }
                return Ok(Some(dir));
            }
            Ok(None) if !waiting => {
                log.warn(
                    "another-instance",
                    "another kata-topo device plugin serves this socket on this node (the \
                     systemd unit and the DaemonSet both running?): waiting until it stops",
                    json!({"socket": config.plugin_dir.join(config.socket_name.as_str()),
                           "lock": path,
                           "retry_seconds": config.register_retry.as_secs_f64()}),
                );
                waiting = true;
            }
            Ok(None) => {}
            Err(source) => return Err(RunError::Lock { path, source }),
        }
        tokio::select! {
            () = tokio::time::sleep(config.register_retry) => {}
            () = &mut *shutdown => return Ok(None),
        }
    }
}

/// The lock directory, made when missing (0700) and opened without following a link; it must
/// be this user's and writable by no one else. `None` when another process holds it.
fn try_lock(path: &Path) -> io::Result<Option<kata_topo_core::files::Dir>> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let dir = kata_topo_core::files::Dir::open(path)?;
    dir.check_private()?;
    match rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(dir)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Scans every [`Config::rescan`] and publishes what changed.
async fn rescan(
    config: Config,
    sysfs: Sysfs,
    log: Log,
    inventory: watch::Sender<Inventory>,
    mut skipped: Vec<Skipped>,
) {
    let mut failing: Option<String> = None;
    loop {
        tokio::time::sleep(config.rescan).await;
        match scan_now(&sysfs, &config).await {
            Ok(found) => {
                if failing.take().is_some() {
                    log.info("scan-recovered", "sysfs can be scanned again", json!({}));
                }
                // A skipped device is announced when it starts being skipped, not every scan.
                let new: Vec<Skipped> = found
                    .skipped
                    .iter()
                    .filter(|s| !skipped.contains(s))
                    .cloned()
                    .collect();
                log_skipped(&log, &new);
                skipped = found.skipped;
                inventory.send_if_modified(|inv| {
                    let changes = inv.update(&found.devices);
                    log_changes(&log, inv, &changes);
                    !changes.is_empty()
                });
            }
            Err(e) => {
                let why = error_chain(&e);
                if failing.as_deref() != Some(&why) {
                    log.error(
                        "scan-failed",
                        "cannot scan sysfs: keeping the last list",
                        json!({"error": why}),
                    );
                    failing = Some(why);
                }
            }
        }
    }
}

/// Stops serving on shutdown; what [`run`] then returns.
async fn stopped(serving: Serving, log: &Log) -> Result<(), RunError> {
    serving.stop(log).await;
    log.info("stopped", "kata-topo device plugin stopped", json!({}));
    Ok(())
}

async fn serve(
    config: &Config,
    sysfs: &Sysfs,
    log: &Log,
    inventory: &watch::Receiver<Inventory>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    tokio::pin!(shutdown);
    let kubelet = config.plugin_dir.join(api::KUBELET_SOCKET);
    loop {
        let serving = Serving::start(config, sysfs, inventory)?;
        log.info(
            "serving",
            "serving the device plugin socket",
            json!({"socket": serving.path}),
        );
        // The kubelet socket registered with, and when registration was last tried.
        let mut registered: Option<Identity> = None;
        let mut last_try: Option<Instant> = None;
        let mut last_error: Option<String> = None;
        loop {
            if !serving.still_there() {
                log.warn(
                    "socket-removed",
                    "the device plugin socket was removed (the kubelet restarted): serving it anew",
                    json!({"socket": serving.path}),
                );
                serving.stop(log).await;
                break;
            }
            let current = identity(&kubelet);
            if current.is_none() {
                registered = None;
            }
            let due = last_try.is_none_or(|t| t.elapsed() >= config.register_retry);
            if let Some(kubelet_id) = current.filter(|k| registered != Some(*k) && due) {
                last_try = Some(Instant::now());
                let outcome = tokio::select! {
                    outcome = register(config) => outcome,
                    () = &mut shutdown => return stopped(serving, log).await,
                };
                match outcome {
                    Ok(()) => {
                        registered = Some(kubelet_id);
                        last_error = None;
                        last_try = None;
                        log.info(
                            "registered",
                            "registered with the kubelet",
                            json!({
                                "kubelet_socket": kubelet,
                                "resource_name": config.resource_name.to_string(),
                                "endpoint": config.socket_name.to_string(),
                            }),
                        );
                    }
                    Err(e) => {
                        let why = error_chain(&e);
                        if last_error.as_deref() != Some(&why) {
                            log.warn(
                                "register-failed",
                                "cannot register with the kubelet: retrying",
                                json!({"kubelet_socket": kubelet, "error": why,
                                       "retry_seconds": config.register_retry.as_secs_f64()}),
                            );
                            last_error = Some(why);
                        }
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(config.poll) => {}
                () = &mut shutdown => return stopped(serving, log).await,
            }
        }
    }
}
