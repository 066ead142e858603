//! Parsed OCI specs by bundle: a `Create` parses `<bundle>/config.json` once, and every later
//! `Update` of the task reuses it instead of reading and parsing it again on the request path.
//! The file is read outside the lock, so one task's read never holds up another's check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kata_topo_core::input::spec::RequestError;
use kata_topo_core::ContainerSpec;

/// The cache.
#[derive(Debug, Default)]
pub(crate) struct SpecCache(Mutex<HashMap<PathBuf, Arc<ContainerSpec>>>);

impl SpecCache {
    /// The spec in `bundle`, parsed at most once.
    pub(crate) fn get(&self, bundle: &Path) -> Result<Arc<ContainerSpec>, RequestError> {
        if let Some(spec) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(bundle) {
            return Ok(Arc::clone(spec));
        }
        let spec = Arc::new(ContainerSpec::from_file(&bundle.join("config.json"))?);
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(bundle.to_path_buf(), Arc::clone(&spec));
        Ok(spec)
    }

    /// The spec in `bundle` as it is now: a recreate reuses the bundle path, so a `Create`
    /// always reads what it brings.
    pub(crate) fn fresh(&self, bundle: &Path) -> Result<Arc<ContainerSpec>, RequestError> {
        self.forget(bundle);
        self.get(bundle)
    }

    /// Keeps a spec read elsewhere (the NRI front end's, from its request) under `bundle`.
    pub(crate) fn put(&self, bundle: &Path, spec: Arc<ContainerSpec>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(bundle.to_path_buf(), spec);
    }

    /// Forgets a bundle (its task was deleted).
    pub(crate) fn forget(&self, bundle: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(bundle);
    }
}
