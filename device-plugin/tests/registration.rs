//! The plugin against a fake kubelet, in process: a `Registration` server on a unix socket in a
//! temporary device plugin directory, the plugin's `run` beside it, and a client dialling the
//! plugin's socket as the kubelet does after `Register`. Everything over real gRPC on real
//! unix sockets; sysfs is a generated tree.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kata_topo_core::testutil::SysfsTree;
use kata_topo_core::Bdf;
use kata_topo_device_plugin::api::device_plugin_client::DevicePluginClient;
use kata_topo_device_plugin::api::registration_server::{Registration, RegistrationServer};
use kata_topo_device_plugin::api::{self, Empty, RegisterRequest};
use kata_topo_device_plugin::config::Config;
use kata_topo_device_plugin::log::Log;
use kata_topo_device_plugin::registration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::{Code, Request, Response, Status, Streaming};

/// How long anything the test waits for may take.
const PATIENCE: Duration = Duration::from_secs(15);

struct FakeKubelet {
    requests: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.requests.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// A running fake kubelet: its registration socket and what it was sent.
struct Kubelet {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    requests: mpsc::UnboundedReceiver<RegisterRequest>,
}

impl Kubelet {
    fn start(dir: &Path) -> Self {
        let path = dir.join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind kubelet.sock");
        let (tx, requests) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(FakeKubelet { requests: tx }))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async move {
                        let _ = stopped.await;
                    },
                ),
        );
        Self {
            stop,
            task,
            requests,
        }
    }

    async fn next_registration(&mut self, log: &Log) -> RegisterRequest {
        match tokio::time::timeout(PATIENCE, self.requests.recv()).await {
            Ok(Some(r)) => r,
            other => panic!(
                "no registration ({other:?}); the plugin logged {:#?}",
                log.lines()
            ),
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the fake kubelet stops")
            .expect("join")
            .expect("serve");
    }
}

fn bdf(s: &str) -> Bdf {
    s.parse().expect("bdf")
}

async fn dial(socket: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    let channel = registration::connect(socket, PATIENCE)
        .await
        .expect("dial the plugin");
    DevicePluginClient::new(channel)
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `(id, health, NUMA nodes)` of each device in a `ListAndWatch` message.
type Listed = Vec<(String, String, Option<Vec<i64>>)>;

async fn next_list(stream: &mut Streaming<api::ListAndWatchResponse>) -> Listed {
    let msg = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a list in time")
        .expect("stream ok")
        .expect("stream open");
    msg.devices
        .into_iter()
        .map(|d| {
            (
                d.id,
                d.health,
                d.topology.map(|t| t.nodes.iter().map(|n| n.id).collect()),
            )
        })
        .collect()
}

fn listed(items: &[(&str, &str, Option<Vec<i64>>)]) -> Listed {
    items
        .iter()
        .map(|(id, h, t)| (id.to_string(), h.to_string(), t.clone()))
        .collect()
}

fn check_registration(r: &RegisterRequest) {
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.endpoint, "kata-topo-vfio.sock");
    assert_eq!(r.resource_name, "kata-topo.io/vfio");
    let options = r.options.as_ref().expect("options");
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);
}

fn socket_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn registers_lists_allocates_follows_unbinding_and_kubelet_restarts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(tmp.path().join("sys")).expect("tree");
    let nic = bdf("0000:80:00.0");
    tree.add_device(nic, 1, Some("vfio-pci"), Some("42"))
        .expect("nic");
    tree.add_iommufd("vfio0", nic).expect("iommufd");
    tree.add_device(bdf("0000:00:05.0"), -1, Some("vfio-pci"), Some("7"))
        .expect("gpu");
    tree.add_device(bdf("0000:01:00.0"), 0, Some("ixgbe"), Some("3"))
        .expect("host nic");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir(&dir).expect("plugin dir");
    let plugin_socket = dir.join("kata-topo-vfio.sock");

    let mut config = Config::new(tree.root(), &dir);
    config.rescan = Duration::from_millis(100);
    config.poll = Duration::from_millis(50);
    config.register_retry = Duration::from_millis(100);
    config.register_timeout = Duration::from_secs(5);
    let log = Log::memory();
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let plugin = tokio::spawn(registration::run(config, log.clone(), async move {
        let _ = shutdown_rx.await;
    }));

    // The plugin serves before any kubelet is there, and registers once one is.
    wait_for("the plugin's socket", || plugin_socket.exists()).await;
    let mut kubelet = Kubelet::start(&dir);
    check_registration(&kubelet.next_registration(&log).await);

    let mut client = dial(&plugin_socket).await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .expect("options")
        .into_inner();
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);

    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("list and watch")
        .into_inner();
    assert_eq!(
        next_list(&mut stream).await,
        listed(&[
            ("0000:00:05.0", "Healthy", None),
            ("0000:80:00.0", "Healthy", Some(vec![1])),
        ])
    );

    let allocated = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["0000:80:00.0".into()],
            }],
        })
        .await
        .expect("allocate")
        .into_inner();
    let specs: Vec<(String, String, String)> = allocated.container_responses[0]
        .devices
        .iter()
        .map(|d| {
            (
                d.host_path.clone(),
                d.container_path.clone(),
                d.permissions.clone(),
            )
        })
        .collect();
    let spec = |p: &str| (p.to_string(), p.to_string(), "rw".to_string());
    assert_eq!(
        specs,
        vec![
            spec("/dev/vfio/vfio"),
            spec("/dev/vfio/42"),
            spec("/dev/vfio/devices/vfio0")
        ]
    );

    let unknown = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["0000:80:00.0".into(), "0000:99:00.0".into()],
            }],
        })
        .await
        .expect_err("unknown device");
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(
        unknown.message().contains("0000:99:00.0"),
        "{}",
        unknown.message()
    );

    // Unbound from vfio-pci: still listed, now Unhealthy.
    tree.unbind(nic).expect("unbind");
    assert_eq!(
        next_list(&mut stream).await,
        listed(&[
            ("0000:00:05.0", "Healthy", None),
            ("0000:80:00.0", "Unhealthy", Some(vec![1])),
        ])
    );

    // The kubelet restarts: it empties its directory and serves a new kubelet.sock. The old
    // stream ends, the plugin serves a new socket and registers again.
    kubelet.stop().await;
    // As the kubelet does: every file, no directory.
    for f in socket_files(&dir).into_iter().filter(|f| !f.is_dir()) {
        std::fs::remove_file(f).expect("wipe");
    }
    let mut kubelet = Kubelet::start(&dir);
    check_registration(&kubelet.next_registration(&log).await);
    let ended = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("the old stream ends in time");
    assert!(
        !matches!(ended, Ok(Some(_))),
        "the old stream ended: {ended:?}"
    );
    wait_for("the new socket", || plugin_socket.exists()).await;
    let mut client = dial(&plugin_socket).await;
    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("list and watch again")
        .into_inner();
    assert_eq!(
        next_list(&mut stream).await,
        listed(&[
            ("0000:00:05.0", "Healthy", None),
            ("0000:80:00.0", "Unhealthy", Some(vec![1])),
        ])
    );

    // Bound again: Healthy again.
    tree.add_device(nic, 1, Some("vfio-pci"), Some("42"))
        .expect("rebind");
    assert_eq!(
        next_list(&mut stream).await,
        listed(&[
            ("0000:00:05.0", "Healthy", None),
            ("0000:80:00.0", "Healthy", Some(vec![1])),
        ])
    );

    // Only kubelet.sock replaced (the plugin's socket left alone): registers again.
    kubelet.stop().await;
    std::fs::remove_file(dir.join("kubelet.sock")).expect("rm kubelet.sock");
    let mut kubelet = Kubelet::start(&dir);
    check_registration(&kubelet.next_registration(&log).await);
    let registered = || {
        log.lines()
            .iter()
            .filter(|l| l["event"] == "registered")
            .count()
    };
    wait_for("the plugin to log its third registration", || {
        registered() == 3
    })
    .await;

    // Stopping removes the plugin's socket and ends its stream.
    shutdown.send(()).expect("shutdown");
    tokio::time::timeout(PATIENCE, plugin)
        .await
        .expect("the plugin stops in time")
        .expect("join")
        .expect("run");
    assert!(!plugin_socket.exists(), "the plugin's socket is removed");
    assert!(
        kubelet.requests.try_recv().is_err(),
        "no extra registration"
    );
    kubelet.stop().await;

    let events: Vec<String> = log
        .lines()
        .iter()
        .filter_map(|l| l["event"].as_str().map(str::to_string))
        .collect();
    let count = |e: &str| events.iter().filter(|x| *x == e).count();
    assert_eq!(count("registered"), 3, "{events:?}");
    assert_eq!(count("socket-removed"), 1, "{events:?}");
    assert_eq!(count("device-unhealthy"), 1, "{events:?}");
    assert_eq!(count("device-healthy"), 1, "{events:?}");
    assert_eq!(count("stopped"), 1, "{events:?}");
}

#[tokio::test]
async fn a_refused_registration_is_logged_once_and_retried() {
    struct Refusing;
    #[tonic::async_trait]
    impl Registration for Refusing {
        async fn register(&self, _: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
            Err(Status::invalid_argument(
                "resource kata-topo.io/vfio is taken",
            ))
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(tmp.path().join("sys")).expect("tree");
    tree.add_device(bdf("0000:80:00.0"), 0, Some("vfio-pci"), Some("1"))
        .expect("dev");
    let dir = tmp.path().join("dp");
    std::fs::create_dir(&dir).expect("dir");
    let listener = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).expect("bind");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Refusing))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move {
                    let _ = stopped.await;
                },
            ),
    );
    let mut config = Config::new(tree.root(), &dir);
    config.poll = Duration::from_millis(20);
    config.register_retry = Duration::from_millis(50);
    let log = Log::memory();
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let plugin = tokio::spawn(registration::run(config, log.clone(), async move {
        let _ = shutdown_rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(600)).await;
    shutdown.send(()).expect("shutdown");
    tokio::time::timeout(PATIENCE, plugin)
        .await
        .expect("stops")
        .expect("join")
        .expect("run");
    let _ = stop.send(());
    let _ = server.await;
    let failed: Vec<String> = log
        .lines()
        .iter()
        .filter(|l| l["event"] == "register-failed")
        .map(|l| l["error"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("InvalidArgument") && failed[0].contains("is taken"),
        "{failed:?}"
    );
    assert!(!log.lines().iter().any(|l| l["event"] == "registered"));
}

#[tokio::test]
async fn a_wrong_sysfs_root_or_a_missing_plugin_dir_stops_it_at_once_naming_the_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("no-sys");
    std::fs::create_dir(&missing).expect("dir");
    let err = registration::run(Config::new(&missing, tmp.path()), Log::memory(), async {})
        .await
        .expect_err("no PCI bus");
    let text = kata_topo_device_plugin::scan::error_chain(&err);
    assert!(text.contains(&missing.display().to_string()), "{text}");

    let tree = SysfsTree::at(tmp.path().join("sys")).expect("tree");
    tree.add_device(bdf("0000:80:00.0"), 0, Some("vfio-pci"), Some("1"))
        .expect("dev");
    let nodir = tmp.path().join("not-there");
    let err = registration::run(Config::new(tree.root(), &nodir), Log::memory(), async {})
        .await
        .expect_err("no plugin dir");
    let text = kata_topo_device_plugin::scan::error_chain(&err);
    assert!(text.contains(&nodir.display().to_string()), "{text}");

    // Something that is not a socket where the plugin's socket goes is never replaced.
    let dir = tmp.path().join("dp");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::write(dir.join("kata-topo-vfio.sock"), "keep me").expect("file");
    let err = registration::run(Config::new(tree.root(), &dir), Log::memory(), async {})
        .await
        .expect_err("not a socket");
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("kata-topo-vfio.sock")).expect("kept"),
        "keep me"
    );
}

/// The systemd unit and the DaemonSet on one node: the second instance says so and waits,
/// never touching the first's socket (before, each replaced the other's every second), and
/// serves once the first stops. A kubelet restart, which empties the directory of its files,
/// does not end the first's lock.
#[tokio::test]
async fn a_second_instance_says_so_and_waits_for_the_first() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(tmp.path().join("sys")).expect("tree");
    tree.add_device(bdf("0000:80:00.0"), 1, Some("vfio-pci"), Some("42"))
        .expect("nic");
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir(&dir).expect("plugin dir");
    let socket = dir.join("kata-topo-vfio.sock");
    let mut config = Config::new(tree.root(), &dir);
    config.rescan = Duration::from_millis(100);
    config.poll = Duration::from_millis(20);
    config.register_retry = Duration::from_millis(50);
    let start = |log: &Log| {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(registration::run(config.clone(), log.clone(), async move {
            let _ = stopped.await;
        }));
        (stop, task)
    };
    let (first_log, second_log) = (Log::memory(), Log::memory());
    let (stop_first, first) = start(&first_log);
    wait_for("the first instance's socket", || socket.exists()).await;
    let (stop_second, second) = start(&second_log);
    wait_for("the second instance to say it waits", || {
        second_log
            .lines()
            .iter()
            .any(|l| l["event"] == "another-instance")
    })
    .await;
    // A kubelet restart removes the directory's files, the first's socket among them.
    for f in socket_files(&dir).into_iter().filter(|f| !f.is_dir()) {
        std::fs::remove_file(f).expect("wipe");
    }
    let count = |log: &Log, event: &str| log.lines().iter().filter(|l| l["event"] == event).count();
    wait_for("the first instance serving anew", || {
        count(&first_log, "serving") == 2 && socket.exists()
    })
    .await;
    // Many of the second's tries later, the first still serves, its socket untouched.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count(&second_log, "serving"),
        0,
        "{:#?}",
        second_log.lines()
    );
    assert_eq!(
        count(&first_log, "socket-removed"),
        1,
        "only the kubelet's restart removed the first's socket: {:#?}",
        first_log.lines()
    );
    assert_eq!(count(&first_log, "serving"), 2);
    let tries = || count(&second_log, "serving");
    // The first stops: the second takes over.
    let _ = stop_first.send(());
    first.await.expect("join").expect("the first stops");
    wait_for("the second instance serving", || tries() == 1).await;
    assert!(second_log
        .lines()
        .iter()
        .any(|l| l["event"] == "instance-lock-taken"));
    wait_for("the second instance's socket", || socket.exists()).await;
    let _ = stop_second.send(());
    second.await.expect("join").expect("the second stops");
}
