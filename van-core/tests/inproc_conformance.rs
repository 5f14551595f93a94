//! The conformance suite over the in-process van.

use van_core::inproc::{Hub, InProcessVan};

van_core::van_conformance_tests!({
    let hub = Hub::new();
    move || InProcessVan::new(&hub)
});
