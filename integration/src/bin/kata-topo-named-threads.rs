//! `kata-topo-named-threads NAME...`: a plain process, one thread per NAME carrying that name
//! (`CPU 0/KVM`, `vcpu1`, …), doing nothing. What the VM view must not take for a VMM, however
//! its threads are called. Prints `ready` once every thread is named, then waits to be killed.

use std::io::Write;

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for name in names.iter().cloned() {
        let tx = tx.clone();
        // std names the OS thread (pthread_setname_np) before running it.
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let _ = tx.send(());
            loop {
                std::thread::park();
            }
        });
        if spawned.is_err() {
            return;
        }
    }
    for _ in &names {
        let _ = rx.recv();
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    loop {
        std::thread::park();
    }
}
