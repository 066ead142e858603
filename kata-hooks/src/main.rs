//! `kata-topo-hook`: kata-topo's checks as an OCI hook, for hosts that cannot switch runtime
//! handler. See `docs/hook.md` for installing it and what each hook point sees.

#![forbid(unsafe_code)]

use std::process::ExitCode;

mod hook;

fn main() -> ExitCode {
    match hook::run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(&e)
        }
    }
}
