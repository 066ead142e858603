//! containerd's configuration file for one test, in the layout of its version, and the runc
//! handler's base runtime spec with the hook.

use std::path::Path;
use std::process::Command;

use crate::{ContainerdBin, PAUSE};

/// containerd's configuration for one test: the same handlers in the layout of its version.
pub(crate) struct ConfigLayout<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) runc_hook: Option<&'a Path>,
    pub(crate) configpath: &'a Path,
    pub(crate) socket_dir: Option<&'a Path>,
}

impl ConfigLayout<'_> {
    /// The runtime handlers, under the CRI runtime table `rt`: `runc`; `kata-topo` (the
    /// wrapper, configured through `KATA_TOPO_CONFIG`); `kata-topo-configpath` (the wrapper
    /// with the runtime option `ConfigPath`, as Kata is configured); `record` and
    /// `record-configpath` (the recording shim in front of runc's, without and with
    /// `ConfigPath`).
    fn runtimes(&self, rt: &str) -> String {
        let hook = self.runc_hook.map_or(String::new(), |base| {
            format!(
                "  base_runtime_spec = \"{}\"\n  pod_annotations = [\"kata-topo.io/*\"]\n",
                base.display()
            )
        });
        let configpath = self.configpath.display();
        format!(
            r#"[{rt}.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{hook}[{rt}.runtimes.kata-topo]
  runtime_type = "io.containerd.kata-topo.v2"
  pod_annotations = ["kata-topo.io/*"]
[{rt}.runtimes.kata-topo-configpath]
  runtime_type = "io.containerd.kata-topo.v2"
  pod_annotations = ["kata-topo.io/*"]
  [{rt}.runtimes.kata-topo-configpath.options]
    ConfigPath = "{configpath}"
[{rt}.runtimes.record]
  runtime_type = "io.containerd.record.v2"
[{rt}.runtimes.record-configpath]
  runtime_type = "io.containerd.record.v2"
  [{rt}.runtimes.record-configpath.options]
    ConfigPath = "{RECORDED_CONFIG_PATH}"
"#
        )
    }

    /// containerd 1.6 / 1.7.
    pub(crate) fn version2(&self) -> String {
        let d = self.dir.display();
        let rt = r#"plugins."io.containerd.grpc.v1.cri".containerd"#;
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/c.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = "{PAUSE}"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
[{rt}]
  default_runtime_name = "runc"
{runtimes}"#,
            runtimes = self.runtimes(rt)
        )
    }

    /// containerd 2.x.
    pub(crate) fn version3(&self) -> String {
        let d = self.dir.display();
        let rt = "plugins.'io.containerd.cri.v1.runtime'.containerd";
        let shims = self.socket_dir.map_or(String::new(), |s| {
            format!(
                "[plugins.'io.containerd.shim.v1.manager']\n  socket_dir = \"{}\"\n",
                s.display()
            )
        });
        format!(
            r#"version = 3
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/c.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_selinux = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{d}/cni/bin"]
  conf_dir = "{d}/cni/conf"
{shims}[{rt}]
  default_runtime_name = "runc"
{runtimes}"#,
            runtimes = self.runtimes(rt)
        )
    }
}

/// The `ConfigPath` the handler `record-configpath` passes (the recording shim only records
/// it; runc's shim never reads the file).
pub const RECORDED_CONFIG_PATH: &str =
    "/opt/kata/share/defaults/kata-containers/configuration-kata-topo.toml";

/// containerd's default OCI spec with `kata-topo-hook` as a createRuntime and poststop hook.
pub(crate) fn write_hooked_base_spec(path: &Path, hook: &Path, config: &Path) {
    let out = Command::new(ContainerdBin::get().ctr())
        .args(["oci", "spec"])
        .output()
        .expect("ctr oci spec");
    assert!(out.status.success(), "ctr oci spec");
    let mut spec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("default spec");
    let entry = serde_json::json!({
        "path": hook,
        "args": ["kata-topo-hook"],
        "env": [format!("KATA_TOPO_CONFIG={}", config.display()), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "timeout": 10
    });
    // createRuntime checks; poststop of the sandbox drops the pod's baselines.
    spec["hooks"] = serde_json::json!({"createRuntime": [entry.clone()], "poststop": [entry]});
    std::fs::write(path, serde_json::to_vec_pretty(&spec).expect("json")).expect("write base spec");
}
