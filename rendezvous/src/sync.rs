//! Locking without poisoning: the one mutex helper every module of the crate uses.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking the data even if a thread panicked while holding it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections in this crate are a few map or queue operations with no call out:
    // a poisoned lock still holds consistent data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
