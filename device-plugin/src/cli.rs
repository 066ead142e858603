//! The command line. Exit codes: 0 stopped by SIGTERM or SIGINT (or `--once` printed), 1 could
//! not start or run (one JSON log line on stderr says why), 2 bad usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kata_topo_core::{Sysfs, VERSION};
use serde_json::json;

use crate::api;
use crate::config::{self, Config, PciId, ResourceName, SocketName};
use crate::log::Log;
use crate::scan::{error_chain, scan, VfioDevice};

/// kata-topo's device plugin: advertises the PCI devices bound to vfio-pci to the kubelet as one
/// resource, each with its NUMA node, and gives a container /dev/vfio/vfio, /dev/vfio/<group>
/// and /dev/vfio/devices/vfioN for the devices it is allocated.
#[derive(Debug, Parser)]
#[command(name = "kata-topo-device-plugin", version = VERSION, disable_version_flag = true)]
struct Cli {
    /// Print the version.
    #[arg(short = 'v', short_alias = 'V', long, action = clap::ArgAction::Version)]
    version: Option<bool>,
    /// Where sysfs is mounted.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// The kubelet's device plugin directory (its kubelet.sock, and this plugin's socket).
    #[arg(long, value_name = "DIR", default_value = config::DEFAULT_PLUGIN_DIR)]
    device_plugin_dir: PathBuf,
    /// The extended resource the devices are advertised as (DOMAIN/NAME).
    #[arg(long, value_name = "NAME", default_value = config::DEFAULT_RESOURCE_NAME)]
    resource_name: ResourceName,
    /// Only devices with these PCI vendor:device ids (as `lspci -n` prints them), comma
    /// separated; default every device bound to vfio-pci.
    #[arg(long, value_name = "VENDOR:DEVICE,...", value_delimiter = ',')]
    ids: Vec<PciId>,
    /// The file name of this plugin's socket in the device plugin directory.
    #[arg(long, value_name = "NAME", default_value = config::DEFAULT_SOCKET_NAME)]
    socket_name: SocketName,
    /// How often sysfs is scanned again for devices bound or unbound, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    rescan_seconds: u64,
    /// Print the devices that would be advertised, as JSON, and exit.
    #[arg(long)]
    once: bool,
}

/// Parses the arguments and runs.
pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let printed = e.print();
            return ExitCode::from(if e.use_stderr() || printed.is_err() {
                2
            } else {
                0
            });
        }
    };
    let mut config = Config::new(&cli.sysfs_root, &cli.device_plugin_dir);
    config.resource_name = cli.resource_name;
    config.socket_name = cli.socket_name;
    config.ids = cli.ids;
    config.rescan = Duration::from_secs(cli.rescan_seconds);
    let log = Log::stderr();
    if cli.once {
        return once(&config, &log);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log.error(
                "start-failed",
                "cannot start the async runtime",
                json!({"error": e.to_string()}),
            );
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let signals = match signals() {
            Ok(s) => s,
            Err(e) => {
                log.error(
                    "start-failed",
                    "cannot watch SIGTERM and SIGINT",
                    json!({"error": e.to_string()}),
                );
                return Err(());
            }
        };
        crate::registration::run(config, log.clone(), signals)
            .await
            .map_err(|e| {
                log.error(
                    "start-failed",
                    "the device plugin cannot run",
                    json!({"error": error_chain(&e)}),
                );
            })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(()) => ExitCode::FAILURE,
    }
}

/// Resolves at the first SIGTERM or SIGINT.
fn signals() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// `--once`: what the plugin would advertise, as JSON on stdout.
fn once(config: &Config, log: &Log) -> ExitCode {
    let found = match scan(&Sysfs::new(&config.sysfs_root), &config.ids) {
        Ok(found) => found,
        Err(e) => {
            log.error(
                "scan-failed",
                "cannot scan sysfs",
                json!({"sysfs_root": config.sysfs_root, "error": error_chain(&e)}),
            );
            return ExitCode::FAILURE;
        }
    };
    let devices: Vec<serde_json::Value> = found
        .devices
        .iter()
        .map(|d| {
            let mut v = json!(d);
            v["health"] = api::HEALTHY.into();
            v["device_specs"] = json!(VfioDevice::device_paths([d]));
            v
        })
        .collect();
    let out = json!({
        "resource_name": config.resource_name.to_string(),
        "socket": config.plugin_dir.join(config.socket_name.as_str()),
        "devices": devices,
        "skipped": found.skipped,
    });
    let mut text = match serde_json::to_string_pretty(&out) {
        Ok(t) => t,
        Err(_) => return ExitCode::FAILURE,
    };
    text.push('\n');
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
