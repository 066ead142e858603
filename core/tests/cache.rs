//! The node-wide topology cache against hwloc's real discovery: this machine, and sysfs/procfs
//! snapshots of real machines that hwloc's Linux backend discovers as if they were live
//! (`HWLOC_FSROOT`, `HWLOC_COMPONENTS=linux,stop`). The snapshots are copied into temporary
//! directories and changed the way the kernel changes them (a CPU taken offline, memory
//! hot-plugged, a device moved, re-bound or removed, a reboot), and the cache must notice each.
//!
//! hwloc reads `HWLOC_*` from the environment of the process, so every test here holds one lock
//! and sets or clears those variables itself; nothing else in this test binary touches hwloc.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use kata_topo_core::host::cache::{CacheKey, Loaded, Miss, Origin, TopologyCache};
use kata_topo_core::testutil::SysfsTree;
use kata_topo_core::{Host, Sysfs, Verdict};

use kata_topo_core::testutil::{bdf, create, resources, spec, update};

static HWLOC_ENV: Mutex<()> = Mutex::new(());

/// The lock, with the hwloc environment pointing at `root` (`None`: this machine).
struct Env<'a> {
    _lock: MutexGuard<'a, ()>,
}

impl Env<'_> {
    fn new(root: Option<&Path>) -> Self {
        let lock = HWLOC_ENV.lock().unwrap_or_else(|e| e.into_inner());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HWLOC_") {
                std::env::remove_var(k);
            }
        }
        if let Some(root) = root {
            std::env::set_var("HWLOC_FSROOT", root);
            std::env::set_var("HWLOC_COMPONENTS", "linux,stop");
        }
        Self { _lock: lock }
    }
}

impl Drop for Env<'_> {
    fn drop(&mut self) {
        std::env::remove_var("HWLOC_FSROOT");
        std::env::remove_var("HWLOC_COMPONENTS");
    }
}

/// One of hwloc's snapshots, unpacked, with a boot id (the snapshots have no procfs `sys/`).
struct Snapshot {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Snapshot {
    fn unpack(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let archive = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hwloc/fsroot")
            .join(format!("{name}.tar.bz2"));
        let status = std::process::Command::new("tar")
            .arg("-xjf")
            .arg(&archive)
            .arg("-C")
            .arg(dir.path())
            .status()
            .expect("run tar (needs bzip2)");
        assert!(status.success(), "unpacking {}", archive.display());
        let root = std::fs::read_dir(dir.path())
            .expect("read")
            .next()
            .expect("one directory")
            .expect("entry")
            .path();
        let snapshot = Self { _dir: dir, root };
        snapshot.write(
            "proc/sys/kernel/random/boot_id",
            "9d4c7a70-1b2e-4c55-8a0e-1f3b5c7d9e01\n",
        );
        snapshot
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).expect("read")
    }
}

/// A state directory as the wrapper creates it (0700).
fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    dir
}

fn cache_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| kata_topo_core::host::cache::is_cache_file(n))
        .collect();
    names.sort();
    names
}

fn discovered_and_stored(loaded: &Loaded, why: &Miss) -> PathBuf {
    match &loaded.origin {
        Origin::Discovered {
            miss,
            stored: Ok(path),
        } if miss == why => path.clone(),
        other => panic!("expected a discovery ({why}) that was stored, got: {other}"),
    }
}

fn cached(loaded: &Loaded) -> PathBuf {
    match &loaded.origin {
        Origin::Cached(path) => path.clone(),
        other => panic!("expected the cached topology, got: {other}"),
    }
}

/// Everything the checks use of a host, field by field (the source names differ).
fn assert_same_host(a: &Host, b: &Host) {
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.nodes, b.nodes);
    assert_eq!(a.online_cpus, b.online_cpus);
    assert_eq!(a.all_cpus, b.all_cpus);
    assert_eq!(a.pci, b.pci);
    for cpu in a.all_cpus.iter() {
        assert_eq!(a.home_node(cpu), b.home_node(cpu), "home of CPU {cpu}");
    }
}

/// Verdicts on requests built from the host itself: a create on each node's CPUs with a
/// memory limit beyond the node, an update across nodes, a CPU that does not exist, and a
/// VFIO device at one of the host's PCI addresses.
fn verdicts(host: &Host, sysfs: &Sysfs) -> Vec<Verdict> {
    let mut out = Vec::new();
    let ids: Vec<u32> = host.nodes.iter().map(|n| n.os_index).collect();
    let device = host.pci.first().map(|d| d.bus_id);
    for (i, node) in host.nodes.iter().filter(|n| !n.cpus.is_empty()).enumerate() {
        let cpus = node.cpus.to_string();
        let mut s = spec()
            .policy(if i % 2 == 0 {
                "single-numa-node"
            } else {
                "restricted"
            })
            .cpus(&cpus)
            .mems(&node.os_index.to_string())
            .memory(i64::try_from(node.memory_bytes).unwrap_or(i64::MAX / 2) + (1 << 30));
        if device.is_some() {
            s = s.device("/dev/vfio/7");
        }
        let s = s.build();
        out.push(create(host, Some(sysfs), &s));
        let other = ids.iter().find(|&&n| n != node.os_index).copied();
        let push = match other
            .and_then(|n| host.node(n))
            .filter(|n| !n.cpus.is_empty())
        {
            Some(n) => n.cpus.to_string(),
            None => host.online_cpus.to_string(),
        };
        out.push(update(
            host,
            Some(sysfs),
            &s,
            &resources(serde_json::json!({"cpu": {"cpus": push}})),
        ));
    }
    let beyond = host.all_cpus.iter().last().unwrap_or(0) + 1;
    out.push(create(
        host,
        Some(sysfs),
        &spec().cpus(&format!("0,{beyond}")).build(),
    ));
    out
}

/// A sysfs tree with the host's first PCI device bound to vfio-pci in group 7, on the node
/// `numa_node` names.
fn vfio_tree(host: &Host, dir: &Path) -> Sysfs {
    let tree = SysfsTree::at(dir.join("sys")).expect("tree");
    if let Some(d) = host.pci.first() {
        let node = d
            .locality
            .nodes()
            .and_then(|n| n.iter().next())
            .map_or(-1, |n| n as i32);
        tree.add_device(d.bus_id, node, Some("vfio-pci"), Some("7"))
            .expect("device");
    }
    Sysfs::new(tree.root())
}

/// A live discovery and a cached load of the same machine are the same host and give the same
/// verdicts.
fn live_and_cached_agree(root: Option<&Path>) {
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), root.unwrap_or(Path::new("/")));
    let first = cache.load().expect("first load");
    let path = discovered_and_stored(&first, &Miss::Absent);
    let meta = std::fs::symlink_metadata(&path).expect("cache file");
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    let again = cache.load().expect("second load");
    assert_eq!(cached(&again), path);
    assert!(again.host.source_name.contains(&path.display().to_string()));

    let (live, _) = Host::discover().expect("live discovery");
    assert_same_host(&live, &again.host);
    assert_same_host(&live, &first.host);

    let tree = tempfile::tempdir().expect("tempdir");
    let sysfs = vfio_tree(&live, tree.path());
    let from_live = verdicts(&live, &sysfs);
    let from_cache = verdicts(&again.host, &sysfs);
    assert!(
        from_live.iter().any(|v| !v.findings.is_empty()),
        "the requests must give findings for the comparison to mean something: {from_live:#?}"
    );
    assert_eq!(from_live, from_cache);
}

#[test]
fn this_machine_live_and_cached_agree() {
    let _env = Env::new(None);
    live_and_cached_agree(None);
}

#[test]
fn snapshots_live_and_cached_agree() {
    for (name, nodes, pci) in [
        ("40intel64-2g2n4c+pcilocality", 4, 23),
        ("offline-cpu0-node0", 1, 0),
        ("32amd64-4s2n4c-cgroup2", 8, 0),
        ("fakememinitiators-1np2c+1npp+gi", 11, 0),
    ] {
        let snap = Snapshot::unpack(name);
        let _env = Env::new(Some(&snap.root));
        let (host, _) = Host::discover().expect(name);
        assert_eq!((host.nodes.len(), host.pci.len()), (nodes, pci), "{name}");
        live_and_cached_agree(Some(&snap.root));
    }
}

/// The `sys/bus/pci/devices/<bdf>` of every device below a host bridge (`pci0000:00`).
fn below_host_bridge(snap: &Snapshot, bridge: &str) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(snap.path("sys/bus/pci/devices"))
        .expect("list")
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.to_string_lossy().contains(&format!("/{bridge}/")))
        })
        .map(|e| format!("sys/bus/pci/devices/{}", e.file_name().to_string_lossy()))
        .collect();
    dirs.sort();
    assert!(dirs.len() > 1, "{bridge}: {dirs:?}");
    dirs
}

/// Each change of what the key covers names that part, rediscovers the machine, stores it
/// under the new key (the old file goes) and is served from the cache the time after.
#[test]
fn every_change_of_the_key_forces_a_rediscovery() {
    let snap = Snapshot::unpack("40intel64-2g2n4c+pcilocality");
    let env = Env::new(Some(&snap.root));
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), &snap.root);
    let mut loaded = cache.load().expect("first load");
    discovered_and_stored(&loaded, &Miss::Absent);
    let mut key = loaded.key.clone().expect("key");

    // The kernel computes a device's local_cpus from its numa_node; the snapshot's are static.
    let node_cpus_mask = snap.read("sys/devices/system/node/node2/cpumap");
    // hwloc places a device on the root bus by its own locality, one behind a bridge by the
    // bridge's.
    let moved = "0000:00:00.0";
    let nic = "sys/bus/pci/devices/0000:02:00.0";

    type Change<'a> = Box<dyn Fn() + 'a>;
    type Check = Box<dyn Fn(&Host, &Host)>;
    let changes: Vec<(&str, &str, Change<'_>, Check)> = vec![
        (
            "a reboot",
            "boot",
            Box::new(|| {
                snap.write(
                    "proc/sys/kernel/random/boot_id",
                    "0b7e54a2-3c11-4f0d-9e2a-6a5d4c3b2a10\n",
                )
            }),
            Box::new(assert_same_host),
        ),
        (
            "CPU 39 taken offline",
            "cpus",
            Box::new(|| {
                snap.write("sys/devices/system/cpu/online", "0-38\n");
                snap.write("sys/devices/system/cpu/cpu39/online", "0\n");
            }),
            Box::new(|before: &Host, after: &Host| {
                assert!(before.online_cpus.contains(39));
                assert!(!after.online_cpus.contains(39), "{}", after.online_cpus);
            }),
        ),
        (
            "memory hot-plugged on node 1",
            "nodes",
            Box::new(|| {
                snap.write("sys/devices/system/node/node1/memory9999/online", "1\n");
                let meminfo = snap.read("sys/devices/system/node/node1/meminfo");
                snap.write(
                    "sys/devices/system/node/node1/meminfo",
                    &meminfo.replace(
                        "MemTotal:       134217728 kB",
                        "MemTotal:       268435456 kB",
                    ),
                );
            }),
            Box::new(|before: &Host, after: &Host| {
                let gib = |h: &Host| h.node(1).expect("node 1").memory_bytes >> 30;
                assert_eq!((gib(before), gib(after)), (128, 256));
            }),
        ),
        (
            "the devices of a host bridge moved to node 2",
            "pci",
            Box::new(|| {
                // The kernel gives every device below a host bridge the bridge's node.
                for dir in below_host_bridge(&snap, "pci0000:00") {
                    snap.write(&format!("{dir}/numa_node"), "2\n");
                    snap.write(&format!("{dir}/local_cpus"), &node_cpus_mask);
                }
            }),
            Box::new(move |before: &Host, after: &Host| {
                let nodes = |h: &Host| {
                    let d = h.pci_device(bdf(moved)).expect("the device");
                    d.locality.nodes().map(|n| n.to_string())
                };
                assert_eq!((nodes(before), nodes(after).as_deref()), (None, Some("2")));
            }),
        ),
        (
            "the NIC re-bound to vfio-pci",
            "pci",
            Box::new(|| {
                let uevent = snap.read(&format!("{nic}/uevent"));
                snap.write(
                    &format!("{nic}/uevent"),
                    &uevent.replace("DRIVER=bnx2", "DRIVER=vfio-pci"),
                );
            }),
            Box::new(assert_same_host),
        ),
        (
            "a device removed",
            "pci",
            Box::new(|| {
                std::fs::remove_file(snap.path("sys/bus/pci/devices/0000:03:00.1")).expect("rm");
            }),
            Box::new(|before: &Host, after: &Host| {
                assert!(before.pci_device(bdf("0000:03:00.1")).is_some());
                assert!(after.pci_device(bdf("0000:03:00.1")).is_none());
            }),
        ),
        (
            "another hwloc setting",
            "software",
            Box::new(|| std::env::set_var("HWLOC_HIDE_ERRORS", "1")),
            Box::new(assert_same_host),
        ),
    ];
    for (what, part, change, check) in changes {
        let before = loaded.host;
        change();
        let now = cache.key().expect("key");
        assert_eq!(now.changed_since(&key), vec![part], "{what}");
        loaded = cache.load().expect(what);
        let path = discovered_and_stored(&loaded, &Miss::Absent);
        check(&before, &loaded.host);
        assert_eq!(
            cache_files(state.path()),
            vec![now.file_name()],
            "{what}: the earlier key's file is gone"
        );
        let again = cache.load().expect(what);
        assert_eq!(cached(&again), path, "{what}");
        assert_same_host(&loaded.host, &again.host);
        key = now;
    }
    drop(env);
}

/// What the key leaves out does not throw the cache away: free memory moves all the time.
#[test]
fn churn_outside_the_key_keeps_the_cache() {
    let snap = Snapshot::unpack("40intel64-2g2n4c+pcilocality");
    let _env = Env::new(Some(&snap.root));
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), &snap.root);
    let first = cache.load().expect("first");
    discovered_and_stored(&first, &Miss::Absent);
    let meminfo = snap.read("sys/devices/system/node/node1/meminfo");
    snap.write(
        "sys/devices/system/node/node1/meminfo",
        &meminfo.replace("MemFree:        85242572 kB", "MemFree:        12345 kB"),
    );
    assert_eq!(cache.key().expect("key"), first.key.clone().expect("key"));
    cached(&cache.load().expect("second"));
}

/// A cache file or directory someone else could have written is never loaded: the machine is
/// discovered and the file replaced by one of this user's.
#[test]
fn untrusted_cache_files_are_rediscovered_and_replaced() {
    let _env = Env::new(None);
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), "/");
    let first = cache.load().expect("first");
    let path = discovered_and_stored(&first, &Miss::Absent);
    let name = path.file_name().expect("name").to_owned();
    let me = rustix::process::geteuid().as_raw();

    let untrusted = |loaded: &Loaded, needle: &str| match &loaded.origin {
        Origin::Discovered {
            miss: Miss::Untrusted(why),
            stored,
        } => {
            assert!(why.contains(needle), "{why}");
            stored.clone()
        }
        other => panic!("expected an untrusted cache, got {other}"),
    };

    // Another user's file.
    std::os::unix::fs::chown(&path, Some(65534), None).expect("chown");
    let stored = untrusted(&cache.load().expect("load"), "belongs to uid 65534");
    assert_eq!(stored.as_deref(), Ok(path.as_path()));
    assert_eq!(std::fs::metadata(&path).expect("meta").uid(), me);
    cached(&cache.load().expect("load"));

    // A file others may write.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let stored = untrusted(&cache.load().expect("load"), "mode 0666");
    assert_eq!(stored.as_deref(), Ok(path.as_path()));
    assert_eq!(
        std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
        0o600
    );

    // A symlink planted at its name: not followed, and its target untouched.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let target = elsewhere.path().join("precious.xml");
    std::fs::copy(&path, &target).expect("copy");
    let before = std::fs::read(&target).expect("read");
    std::fs::remove_file(&path).expect("rm");
    std::os::unix::fs::symlink(&target, &path).expect("plant");
    let stored = untrusted(&cache.load().expect("load"), "symbolic link");
    assert_eq!(stored.as_deref(), Ok(path.as_path()));
    assert_eq!(std::fs::read(&target).expect("read"), before);
    assert!(!std::fs::symlink_metadata(&path)
        .expect("meta")
        .file_type()
        .is_symlink());

    // A FIFO: refused at once, never waited on.
    std::fs::remove_file(&path).expect("rm");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("fifo");
    let stored = untrusted(&cache.load().expect("load"), "not a regular file");
    assert_eq!(stored.as_deref(), Ok(path.as_path()));
    assert!(std::fs::symlink_metadata(&path)
        .expect("meta")
        .file_type()
        .is_file());

    // Not XML hwloc loads: rediscovered and overwritten.
    std::fs::write(&path, "<topology>").expect("write");
    match &cache.load().expect("load").origin {
        Origin::Discovered {
            miss: Miss::Unreadable(_),
            stored: Ok(p),
        } => assert_eq!(p, &path),
        other => panic!("expected an unreadable cache, got {other}"),
    }
    cached(&cache.load().expect("load"));

    // A directory others may write: nothing in it is trusted, and nothing is stored there.
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let stored = untrusted(&cache.load().expect("load"), "mode 0777");
    assert!(stored.is_err(), "stored in a directory others may write");
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    cached(&cache.load().expect("load"));
    assert_eq!(
        cache_files(state.path()),
        vec![name.to_string_lossy().into_owned()]
    );
}

/// Without a key nothing is cached and the machine is still discovered.
#[test]
fn without_a_key_the_machine_is_discovered_and_nothing_stored() {
    let snap = Snapshot::unpack("offline-cpu0-node0");
    let _env = Env::new(Some(&snap.root));
    std::fs::remove_file(snap.path("proc/sys/kernel/random/boot_id")).expect("rm");
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), &snap.root);
    let loaded = cache.load().expect("load");
    match &loaded.origin {
        Origin::Discovered {
            miss: Miss::NoKey(why),
            stored: Err(_),
        } => assert!(why.contains("boot_id"), "{why}"),
        other => panic!("expected a discovery without a key, got {other}"),
    }
    assert!(loaded.key.is_none());
    assert!(
        !loaded.host.online_cpus.contains(0),
        "the snapshot's CPU 0 is offline"
    );
    assert!(cache_files(state.path()).is_empty());
}

/// The key names what it read: each part is there, and another root is another key.
#[test]
fn keys_of_different_machines_differ() {
    let a = Snapshot::unpack("40intel64-2g2n4c+pcilocality");
    let b = Snapshot::unpack("32amd64-4s2n4c-cgroup2");
    let _env = Env::new(None);
    let ka = CacheKey::read(&a.root).expect("a");
    let kb = CacheKey::read(&b.root).expect("b");
    assert_ne!(ka.digest(), kb.digest());
    assert_eq!(kb.changed_since(&ka), vec!["cpus", "nodes", "pci"]);
    assert_eq!(ka.file_name().len(), "topology-.xml".len() + 64);
    assert_eq!(CacheKey::read(&a.root).expect("again"), ka);
}

/// A CPU taken offline and back online while hwloc discovers the machine: the key reads the
/// same before and after, but what hwloc found is the machine with the CPU offline. That must
/// never be stored under the key of the machine with the CPU online (every later daemon and
/// hook would believe it until a reboot); the next load discovers again and stores.
#[test]
fn a_machine_changed_and_changed_back_during_a_discovery_is_not_stored() {
    let snap = Arc::new(Snapshot::unpack("40intel64-2g2n4c+pcilocality"));
    let _env = Env::new(Some(&snap.root));
    let state = state_dir();
    let flicker = Arc::clone(&snap);
    let racing = TopologyCache::new(state.path(), &snap.root).with_discovery(move || {
        flicker.write("sys/devices/system/cpu/online", "0-38\n");
        flicker.write("sys/devices/system/cpu/cpu39/online", "0\n");
        let found = Host::discover();
        flicker.write("sys/devices/system/cpu/online", "0-39\n");
        flicker.write("sys/devices/system/cpu/cpu39/online", "1\n");
        found
    });
    let loaded = racing.load().expect("load");
    assert!(
        !loaded.host.online_cpus.contains(39),
        "the racing discovery"
    );
    match &loaded.origin {
        Origin::Discovered {
            miss: Miss::Absent,
            stored: Err(why),
        } => assert!(
            why.contains("online CPUs") && why.contains("39"),
            "the reason names the fact that differs: {why}"
        ),
        other => panic!("expected a discovery that was not stored, got {other}"),
    }
    assert!(cache_files(state.path()).is_empty());

    let cache = TopologyCache::new(state.path(), &snap.root);
    let again = cache.load().expect("load");
    discovered_and_stored(&again, &Miss::Absent);
    assert!(again.host.online_cpus.contains(39));
    cached(&cache.load().expect("load"));
}

/// The same for a device: an SR-IOV VF that appears during the discovery and is gone again,
/// and a device whose locality flickers.
#[test]
fn a_device_that_flickers_during_a_discovery_is_not_stored() {
    let snap = Arc::new(Snapshot::unpack("40intel64-2g2n4c+pcilocality"));
    let _env = Env::new(Some(&snap.root));
    let state = state_dir();
    let moved = "sys/bus/pci/devices/0000:00:00.0";
    let node2 = snap.read("sys/devices/system/node/node2/cpumap");
    let flicker = Arc::clone(&snap);
    let racing = TopologyCache::new(state.path(), &snap.root).with_discovery(move || {
        let before = flicker.read(&format!("{moved}/local_cpus"));
        flicker.write(&format!("{moved}/local_cpus"), &node2);
        let found = Host::discover();
        flicker.write(&format!("{moved}/local_cpus"), &before);
        found
    });
    let loaded = racing.load().expect("load");
    match &loaded.origin {
        Origin::Discovered {
            stored: Err(why), ..
        } => assert!(why.contains("0000:00:00.0"), "{why}"),
        other => panic!("expected a discovery that was not stored, got {other}"),
    }
    assert!(cache_files(state.path()).is_empty());
}

/// A node's memory moves without any change of topology: a virtio-mem device or a balloon
/// driver plugs memory into blocks already online, in 128 MiB steps (the development VM's
/// `MemTotal` grew by 3 GiB in two minutes that way). The key stays, the cache stays, and the
/// host's memory is the node's memory now, not at the discovery.
#[test]
fn memory_moving_inside_online_blocks_keeps_the_key_and_is_read_live() {
    let snap = Snapshot::unpack("40intel64-2g2n4c+pcilocality");
    let _env = Env::new(Some(&snap.root));
    let state = state_dir();
    let cache = TopologyCache::new(state.path(), &snap.root);
    let first = cache.load().expect("first");
    discovered_and_stored(&first, &Miss::Absent);
    let meminfo = snap.read("sys/devices/system/node/node1/meminfo");
    snap.write(
        "sys/devices/system/node/node1/meminfo",
        &meminfo.replace(
            "MemTotal:       134217728 kB",
            "MemTotal:       134348800 kB",
        ),
    );
    assert_eq!(cache.key().expect("key"), first.key.clone().expect("key"));
    let again = cache.load().expect("second");
    cached(&again);
    assert_eq!(
        again.host.node(1).expect("node 1").memory_bytes,
        134_348_800 * 1024
    );
}
