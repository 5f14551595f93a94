//! The RDMA van's decoders of peer bytes: the queue-pair attributes read from the side
//! channel and the header of every SEND. Neither may panic; what decodes must re-encode to
//! the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use van_rdma::protocol::{Header, QpAttributes};

fuzz_target!(|data: &[u8]| {
    if let Ok(attrs) = QpAttributes::decode(data) {
        assert_eq!(QpAttributes::decode(&attrs.encode()), Ok(attrs));
    }
    if let Ok((header, _)) = Header::decode(data) {
        let mut buf = [0u8; Header::CONTROL_LEN];
        let n = header.encode(&mut buf);
        assert_eq!(Header::decode(&buf[..n]), Ok((header, n)));
    }
});
