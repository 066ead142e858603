//! containerd's configuration file for one test, in the layout of its version (from the
//! template `integration/templates/containerd.toml`), and the runc handler's base runtime spec
//! with the hook.

use std::path::Path;
use std::process::Command;

use crate::{templates, ContainerdBin, PAUSE};

/// containerd's configuration for one test: the same handlers in the layout of its version.
pub(crate) struct ConfigLayout<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) runc_hook: Option<&'a Path>,
    pub(crate) configpath: &'a Path,
    pub(crate) socket_dir: Option<&'a Path>,
    /// containerd 2.x: NRI's plugin request timeout (e.g. `"2s"`); default containerd's.
    pub(crate) nri_timeout: Option<&'a str>,
    /// containerd's debug logging (shims get `-debug`).
    pub(crate) debug: bool,
}

impl ConfigLayout<'_> {
    /// The configuration from the template (`integration/templates/containerd.toml`) in the
    /// layout of containerd 2.x (`version3`) or 1.6/1.7, with the handlers `runc`; `kata-topo`
    /// (the wrapper, configured through `KATA_TOPO_CONFIG`); `kata-topo-configpath` (the wrapper
    /// with the runtime option `ConfigPath`, as Kata is configured); `record` and
    /// `record-configpath` (the recording shim in front of runc's, without and with
    /// `ConfigPath`); runc's base runtime spec with the hook when there is one.
    pub(crate) fn render(&self, version3: bool) -> String {
        let text = |p: &Path| p.display().to_string();
        let d = self.dir;
        let (root, state, address, opt, cni) = (
            text(&d.join("root")),
            text(&d.join("state")),
            text(&d.join("c.sock")),
            text(&d.join("opt")),
            text(&d.join("cni")),
        );
        let hook = self.runc_hook.map(text).unwrap_or_default();
        let socket_dir = self.socket_dir.map(text).unwrap_or_default();
        let configpath = text(self.configpath);
        // 2.x has NRI on: its socket and plugin folders are this containerd's own.
        let (nri_socket, nri_dir) = (text(&d.join("nri.sock")), text(&d.join("nri")));
        let values = [
            (if version3 { "V3" } else { "V2" }, "1"),
            ("ROOT", root.as_str()),
            ("STATE", state.as_str()),
            ("ADDRESS", address.as_str()),
            ("OPT", opt.as_str()),
            ("CNI", cni.as_str()),
            ("SANDBOX_IMAGE", PAUSE),
            ("SOCKET_DIR", socket_dir.as_str()),
            ("RUNC_BASE_SPEC", hook.as_str()),
            ("CONFIG_PATH", configpath.as_str()),
            ("RECORD_CONFIG_PATH", RECORDED_CONFIG_PATH),
            ("NRI_SOCKET", nri_socket.as_str()),
            ("NRI_DIR", nri_dir.as_str()),
            ("NRI_TIMEOUT", self.nri_timeout.unwrap_or_default()),
            ("DEBUG", if self.debug { "1" } else { "" }),
        ];
        templates::render(templates::CONTAINERD, &values).expect("the containerd template renders")
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
