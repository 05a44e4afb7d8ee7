#![no_main]
//! Feeds arbitrary bytes to the registry value decoder, as any site can write them. Whatever
//! decodes is valid, re-encodes, and decodes again to the same registration (d_free to within a unit in the last place); ranking a list
//! holding it never panics and never lists an invalid entry.

use libfuzzer_sys::fuzz_target;
use switchyard_rescue::registry::{rank, Registration};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Registration::decode(data) {
        assert!(r.validate().is_ok());
        let again = Registration::decode(&r.encode()).expect("a decoded registration re-encodes");
        // serde_json reads a float back to within one unit in the last place.
        let d = (again.d_free_kbps - r.d_free_kbps).abs();
        assert!(d <= r.d_free_kbps * 1e-15, "{} != {}", again.d_free_kbps, r.d_free_kbps);
        assert_eq!((&again.url, again.ip, again.port_dots, &again.domain), (&r.url, r.ip, r.port_dots, &r.domain));
        for x in rank([r.clone(), again], "self.invalid", 4) {
            assert!(x.validate().is_ok() && x.d_free_kbps > 0.0);
        }
    }
});
