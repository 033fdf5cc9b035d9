//! Dates for chat templates: C's `strftime` (the "C" locale) over a UTC time, for the template function
//! `strftime_now(format)` and llama.cpp's `date_string` / `datetime` variables.
//!
//! [`Utc::from_unix`] splits seconds since 1970 into the calendar fields; [`Utc::strftime`] formats them.
//! llama.cpp formats the server's local time; shoal always uses UTC (the same on servers that run in
//! UTC, as most do).

use std::fmt::Write;

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// One instant in UTC, split into calendar fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Utc {
    unix: i64,
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Sunday
    weekday: u32,
    /// 0..=365
    yday: u32,
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

impl Utc {
    pub(super) fn from_unix(unix: i64) -> Self {
        let days = unix.div_euclid(86_400);
        let secs = unix.rem_euclid(86_400) as u32;
        // Gregorian date from days since 1970-01-01, counting in 400-year eras that start on March 1st
        // (so the leap day is the last day of a year).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097); // day of era, 0..146097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
        let mp = (5 * doy + 2) / 153; // month, March = 0
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap_day = u32::from(month > 2 && is_leap(year));
        Self {
            unix,
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            weekday: (days + 4).rem_euclid(7) as u32,
            yday: before[month as usize - 1] + day - 1 + leap_day,
        }
    }

    /// `format` with the conversions of C's `strftime` in the "C" locale; an unknown conversion is
    /// copied as written.
    pub(super) fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some(spec) => self.conversion(spec, &mut out),
                None => out.push('%'),
            }
        }
        out
    }

    fn conversion(&self, spec: char, out: &mut String) {
        let weekday = WEEKDAYS[self.weekday as usize];
        let month = MONTHS[self.month as usize - 1];
        let hour12 = (self.hour + 11) % 12 + 1;
        // Writing to a String cannot fail.
        let _ = match spec {
            'a' => write!(out, "{}", &weekday[..3]),
            'A' => write!(out, "{weekday}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'B' => write!(out, "{month}"),
            'c' => write!(out, "{}", self.strftime("%a %b %e %H:%M:%S %Y")),
            'C' => write!(out, "{:02}", self.year.div_euclid(100)),
            'd' => write!(out, "{:02}", self.day),
            'D' | 'x' => write!(out, "{}", self.strftime("%m/%d/%y")),
            'e' => write!(out, "{:2}", self.day),
            'F' => write!(out, "{}", self.strftime("%Y-%m-%d")),
            'H' => write!(out, "{:02}", self.hour),
            'I' => write!(out, "{hour12:02}"),
            'j' => write!(out, "{:03}", self.yday + 1),
            'm' => write!(out, "{:02}", self.month),
            'M' => write!(out, "{:02}", self.minute),
            'n' => writeln!(out),
            'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
            'r' => write!(out, "{}", self.strftime("%I:%M:%S %p")),
            'R' => write!(out, "{}", self.strftime("%H:%M")),
            's' => write!(out, "{}", self.unix),
            'S' => write!(out, "{:02}", self.second),
            't' => write!(out, "\t"),
            'T' | 'X' => write!(out, "{}", self.strftime("%H:%M:%S")),
            'u' => write!(out, "{}", (self.weekday + 6) % 7 + 1),
            'w' => write!(out, "{}", self.weekday),
            'y' => write!(out, "{:02}", self.year.rem_euclid(100)),
            'Y' => write!(out, "{}", self.year),
            'z' => write!(out, "+0000"),
            'Z' => write!(out, "UTC"),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_fields() {
        let epoch = Utc::from_unix(0);
        assert_eq!((epoch.year, epoch.month, epoch.day), (1970, 1, 1));
        assert_eq!((epoch.weekday, epoch.yday), (4, 0)); // a Thursday
        // 2024-02-29 23:59:59 UTC, a Thursday, day 60 of a leap year.
        let t = Utc::from_unix(1_709_251_199);
        assert_eq!((t.year, t.month, t.day), (2024, 2, 29));
        assert_eq!((t.hour, t.minute, t.second), (23, 59, 59));
        assert_eq!((t.weekday, t.yday), (4, 59));
        // 2000-12-31: day 366 of a leap year (divisible by 400).
        let t = Utc::from_unix(978_220_800);
        assert_eq!((t.year, t.month, t.day, t.yday), (2000, 12, 31, 365));
        // 1969-12-31 23:00:00, before the epoch.
        let t = Utc::from_unix(-3600);
        assert_eq!(
            (t.year, t.month, t.day, t.hour, t.weekday),
            (1969, 12, 31, 23, 3)
        );
    }

    #[test]
    fn every_day_of_four_centuries_follows_the_previous() {
        let mut prev = Utc::from_unix(-86_400 * 365 * 100);
        for d in 1..(146_097 + 366) {
            let t = Utc::from_unix(prev.unix + 86_400);
            let next_day = (t.year, t.month, t.day) > (prev.year, prev.month, prev.day);
            assert!(next_day, "day {d}: {prev:?} -> {t:?}");
            assert_eq!(t.weekday, (prev.weekday + 1) % 7);
            if t.year == prev.year {
                assert_eq!(t.yday, prev.yday + 1);
            } else {
                assert_eq!((t.month, t.day, t.yday), (1, 1, 0));
                assert_eq!(prev.yday, if is_leap(prev.year) { 365 } else { 364 });
            }
            prev = t;
        }
    }

    #[test]
    fn strftime_conversions() {
        // 2024-07-05 08:09:03 UTC, a Friday.
        let t = Utc::from_unix(1_720_166_943);
        assert_eq!(t.strftime("%d %b %Y"), "05 Jul 2024");
        assert_eq!(t.strftime("%b %d %Y"), "Jul 05 2024");
        assert_eq!(t.strftime("%A, %B %e %y"), "Friday, July  5 24");
        assert_eq!(t.strftime("%a %h %j %u %w"), "Fri Jul 187 5 5");
        assert_eq!(
            t.strftime("%F %T %R %D"),
            "2024-07-05 08:09:03 08:09 07/05/24"
        );
        assert_eq!(t.strftime("%I %p %r"), "08 AM 08:09:03 AM");
        assert_eq!(t.strftime("%c"), "Fri Jul  5 08:09:03 2024");
        assert_eq!(t.strftime("%C %s %z %Z"), "20 1720166943 +0000 UTC");
        assert_eq!(t.strftime("100%% %q%n%t|%"), "100% %q\n\t|%");
        let noon = Utc::from_unix(1_720_166_943 + 4 * 3600);
        assert_eq!(noon.strftime("%H %I %p"), "12 12 PM");
        let midnight = Utc::from_unix(1_720_137_600);
        assert_eq!(midnight.strftime("%H %I %p"), "00 12 AM");
    }
}
