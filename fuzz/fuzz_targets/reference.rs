//! Any input: the reference parser never panics, and what it accepts is canonical and safe.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnpike_schemas::Reference;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(reference) = text.parse::<Reference>() else {
        return;
    };
    let printed = reference.to_string();
    let again: Reference = printed.parse().expect("a printed reference parses");
    assert_eq!(again, reference);
    assert_eq!(again.to_string(), printed);
    for segment in reference.path().segments() {
        assert!(!segment.is_empty() && segment != "." && segment != "..");
        assert!(!segment.contains(['/', '\\', '%']));
        assert!(!segment.chars().any(char::is_control));
    }
});
