//! Join-link parsing (§10). Oracles: formatting a parsed link re-parses to an equal link, and
//! the server URL never carries credentials.
#![no_main]

use cotald::protocol::JoinLink;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(link) = JoinLink::parse(text) {
        let formatted = link.to_string();
        let again = JoinLink::parse(&formatted).expect("formatted link re-parses");
        assert_eq!(again, link, "{formatted}");
        assert!(!link.server_url().contains('@'));
    }
});
