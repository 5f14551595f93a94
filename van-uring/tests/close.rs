//! An orderly stop of the io_uring van loses no flushed frame while its peer reads slowly and
//! its own input is unread (the check lives in `van_core::testkit`, shared with TCP).

#![cfg(target_os = "linux")]

/// The peer is a TCP van: it stops reading its socket while its inbox is full, so the io_uring
/// van's kernel still holds unsent frames when it has written its last one (an io_uring peer
/// reads everything into memory at once, and the check would pass without the wait for
/// acknowledgements).
#[test]
fn an_orderly_stop_loses_no_flushed_frame_while_input_is_unread() {
    van_core::testkit::run(van_core::testkit::flushed_frames_survive_unread_input(
        &|| {
            van_uring::IoUringVan::new(van_uring::UringOptions::default())
                .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
        },
        &van_tcp::TcpVan::default,
    ));
}

#[test]
fn a_failed_write_loses_no_received_frame() {
    van_core::testkit::run(van_core::testkit::received_frames_survive_a_failed_write(
        &|| {
            van_uring::IoUringVan::new(van_uring::UringOptions::default())
                .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
        },
    ));
}

#[test]
fn a_reset_loses_no_received_frame() {
    van_core::testkit::run(van_core::testkit::received_frames_survive_a_reset(&|| {
        van_uring::IoUringVan::new(van_uring::UringOptions::default())
            .unwrap_or_else(|e| panic!("cannot create the io_uring van: {e}"))
    }));
}
