//! The renderer's shared random generator, behind `password`, `pet_name` and certificate serial
//! numbers, and how a function draws from it.

use std::sync::{Arc, Mutex, PoisonError};

use rand::rngs::ChaCha20Rng;

/// The generator behind `password`, `pet_name` and certificate serial numbers.
pub(super) type SharedRng = Arc<Mutex<ChaCha20Rng>>;

/// The shared generator, locked for one draw.
pub(super) fn lock(rng: &SharedRng) -> std::sync::MutexGuard<'_, ChaCha20Rng> {
    // The generator holds no invariant a panic could break.
    rng.lock().unwrap_or_else(PoisonError::into_inner)
}
