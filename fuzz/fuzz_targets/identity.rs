//! Any input: identity parsing never panics and round-trips what it accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnpike_schemas::Identity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(identity) = text.parse::<Identity>() {
        assert_eq!(identity.to_string().parse::<Identity>().unwrap(), identity);
    }
});
