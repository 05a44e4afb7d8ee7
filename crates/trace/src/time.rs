//! Log timestamps: `[10/Oct/2000:13:55:36 -0700]` to Unix seconds and back.
//!
//! Calendar arithmetic is done by hand on the proleptic Gregorian calendar
//! (days-from-civil), so the crate needs no date library and no clock.

use std::fmt;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Earliest accepted time: 0000-01-01T00:00:00Z.
pub const MIN_TIME: i64 = -62_167_219_200;
/// Latest accepted time: 9999-12-31T23:59:59Z.
pub const MAX_TIME: i64 = 253_402_300_799;

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1–12).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `(year, month, day)` of a day count since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if month <= 2 { y + 1 } else { y }, month, day)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn digits(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 9 {
        return None;
    }
    let mut v = 0u32;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(b - b'0');
    }
    Some(v)
}

/// A parsed log timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogTime {
    /// Unix seconds (UTC).
    pub unix: i64,
    /// Whether the timestamp carried a zone offset; without one it is taken as UTC.
    pub had_zone: bool,
}

/// Parses the inside of a log timestamp, `dd/Mon/yyyy:HH:MM:SS ±hhmm`.
///
/// The day may have one or two digits, the month name is matched without
/// regard to case, and the zone may be missing (then UTC is assumed and
/// [`LogTime::had_zone`] is false). Second 60 (a leap second) is accepted
/// and lands on the next minute. Times outside years 0000–9999 in UTC are
/// refused so that every accepted time can be written back.
pub fn parse_log_time(s: &str) -> Option<LogTime> {
    let b = s.as_bytes();
    let slash1 = b.iter().position(|&c| c == b'/')?;
    let day = digits(&b[..slash1]).filter(|d| (1..=2).contains(&slash1) && *d >= 1)?;
    let rest = &b[slash1 + 1..];
    if rest.len() < 4 || rest[3] != b'/' {
        return None;
    }
    let month = MONTHS
        .iter()
        .position(|m| m.as_bytes().eq_ignore_ascii_case(&rest[..3]))? as u32
        + 1;
    let rest = &rest[4..];
    // yyyy:HH:MM:SS
    if rest.len() < 13 || rest[4] != b':' || rest[7] != b':' || rest[10] != b':' {
        return None;
    }
    let year = i64::from(digits(&rest[..4])?);
    let hour = digits(&rest[5..7])?;
    let minute = digits(&rest[8..10])?;
    let second = digits(&rest[11..13])?;
    if day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let zone = &rest[13..];
    let (offset, had_zone) = if zone.is_empty() {
        (0i64, false)
    } else {
        if zone.len() != 6 || zone[0] != b' ' {
            return None;
        }
        let sign = match zone[1] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let hh = digits(&zone[2..4])?;
        let mm = digits(&zone[4..6])?;
        if hh > 23 || mm > 59 {
            return None;
        }
        (sign * i64::from(hh * 3600 + mm * 60), true)
    };
    let unix = days_from_civil(year, month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second)
        - offset;
    if !(MIN_TIME..=MAX_TIME).contains(&unix) {
        return None;
    }
    Some(LogTime { unix, had_zone })
}

/// Displays Unix seconds as a log timestamp in UTC, `dd/Mon/yyyy:HH:MM:SS +0000`
/// (without the brackets). Times outside [`MIN_TIME`]..=[`MAX_TIME`] are clamped.
#[derive(Clone, Copy, Debug)]
pub struct ClfTime(pub i64);

impl fmt::Display for ClfTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0.clamp(MIN_TIME, MAX_TIME);
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
            d,
            MONTHS[(m - 1) as usize],
            y,
            secs / 3600,
            secs % 3600 / 60,
            secs % 60
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_times() {
        // 1995-06-01T06:00:59Z
        let t = parse_log_time("01/Jun/1995:00:00:59 -0600").unwrap();
        assert_eq!(t.unix, 801_986_459);
        assert!(t.had_zone);
        assert_eq!(
            parse_log_time("17/May/2015:10:05:03 +0000").unwrap().unix,
            1_431_857_103
        );
        assert_eq!(
            parse_log_time("1/jan/1970:00:00:00").unwrap(),
            LogTime {
                unix: 0,
                had_zone: false
            }
        );
        assert_eq!(
            parse_log_time("10/Oct/2000:13:55:36 -0700").unwrap().unix,
            971_211_336
        );
    }

    #[test]
    fn rejects_bad_times() {
        for s in [
            "",
            "32/Jan/2000:00:00:00 +0000",
            "29/Feb/1900:00:00:00 +0000",
            "10/Foo/2000:00:00:00 +0000",
            "10/Oct/2000:24:00:00 +0000",
            "10/Oct/2000:13:60:00 +0000",
            "10/Oct/2000:13:55:36 0700",
            "10/Oct/2000:13:55:36 +07",
            "10/Oct/20:13:55:36 +0000",
            "001/Oct/2000:13:55:36 +0000",
            "0/Oct/2000:13:55:36 +0000",
            "01/Jan/0000:00:00:00 +0100",
            "31/Dec/9999:23:59:59 -0100",
        ] {
            assert!(parse_log_time(s).is_none(), "{s}");
        }
        assert!(parse_log_time("29/Feb/2000:00:00:00 +0000").is_some());
    }

    #[test]
    fn formats_and_round_trips() {
        assert_eq!(ClfTime(0).to_string(), "01/Jan/1970:00:00:00 +0000");
        assert_eq!(
            ClfTime(801_986_459).to_string(),
            "01/Jun/1995:06:00:59 +0000"
        );
        for t in [MIN_TIME, -1, 0, 951_782_400, 1_431_857_103, MAX_TIME] {
            let s = ClfTime(t).to_string();
            assert_eq!(parse_log_time(&s).unwrap().unix, t, "{s}");
        }
    }

    #[test]
    fn civil_round_trip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
