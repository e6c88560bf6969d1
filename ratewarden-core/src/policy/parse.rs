//! Policies as text: the grammar is in [`Policy`]'s docs.
//!
//! About 490 lines of grammar and errors, then its tests.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{Algorithm, MAX_LOG_LIMIT, Policy};
use crate::ban::Ban;
use crate::error::ConfigError;

/// The algorithm of a policy written without one.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingLog;

const MICROS_PER_DAY: u64 = 86_400_000_000;

/// Units a period may be written in, with their length in microseconds.
const UNITS: &[(&[&str], u64)] = &[
    (
        &["us", "µs", "μs", "micros", "microsecond", "microseconds"],
        1,
    ),
    (&["ms", "millis", "millisecond", "milliseconds"], 1_000),
    (&["s", "sec", "secs", "second", "seconds"], 1_000_000),
    (&["m", "min", "mins", "minute", "minutes"], 60_000_000),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600_000_000),
    (&["d", "day", "days"], MICROS_PER_DAY),
    (&["w", "week", "weeks"], 7 * MICROS_PER_DAY),
];

/// The units `Display` writes, longest first: the largest that divides a
/// period is used.
const SHOWN_UNITS: &[(&str, u64)] = &[
    ("d", MICROS_PER_DAY),
    ("h", 3_600_000_000),
    ("min", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];

/// Text that is not a policy, or describes one the constructors refuse.
///
/// Its message quotes the input (the first 64 characters of it) and says
/// what is wrong and, for a token, at which column (counted in characters
/// from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsePolicyError {
    input: String,
    column: Option<usize>,
    reason: String,
    config: Option<ConfigError>,
    /// For a part of a list ([`parse_policies`]): its number, from 1, and
    /// the whole list as shown. Boxed: most errors are of one policy.
    part: Option<Box<(usize, String)>>,
}

impl ParsePolicyError {
    fn at(input: &str, column: usize, reason: String) -> Self {
        ParsePolicyError {
            input: shown(input),
            column: Some(column),
            reason,
            config: None,
            part: None,
        }
    }

    fn refused(input: &str, error: ConfigError, hint: Option<String>) -> Self {
        let reason = match hint {
            Some(h) => format!("{error}; {h}"),
            None => error.to_string(),
        };
        ParsePolicyError {
            input: shown(input),
            column: None,
            reason,
            config: Some(error),
            part: None,
        }
    }

    /// The same error, for part `n` (from 1) of the list `list`.
    fn in_part(mut self, n: usize, list: &str) -> Self {
        self.part = Some(Box::new((n, shown(list))));
        self
    }

    /// For an error in one part of a list ([`parse_policies`]), the part's
    /// number, counted from 1; the [`column`](Self::column) is then within
    /// that part.
    pub fn part(&self) -> Option<usize> {
        self.part.as_ref().map(|p| p.0)
    }

    /// The column (in characters, from 1) of the token that is wrong, when
    /// one token is.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// What is wrong, without the input.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The constructor's error, when the text was well formed but the
    /// policy it describes is refused (a zero limit, a window too long…).
    pub fn config_error(&self) -> Option<&ConfigError> {
        self.config.as_ref()
    }
}

impl fmt::Display for ParsePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid policy {:?}", self.input)?;
        if let Some(part) = &self.part {
            let (n, list) = &**part;
            write!(f, " (part {n} of {list:?})")?;
        }
        f.write_str(": ")?;
        match self.column {
            Some(c) => write!(f, "at column {c}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for ParsePolicyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.config
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The input as an error shows it: at most 64 characters.
fn shown(input: &str) -> String {
    match input.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &input[..end]),
        None => input.to_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok<'a> {
    Num(&'a str),
    Word(&'a str),
    Slash,
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Num(s) | Tok::Word(s) => write!(f, "{:?}", shown(s)),
            Tok::Slash => f.write_str("\"/\""),
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == 'µ' || c == 'μ'
}

/// Splits `input` into tokens with their columns.
fn tokens(input: &str) -> Result<Vec<(usize, Tok<'_>)>, ParsePolicyError> {
    let mut out = Vec::new();
    let mut chars = input.char_indices().enumerate().peekable();
    while let Some((col, (start, c))) = chars.next() {
        let column = col + 1;
        let run = |chars: &mut std::iter::Peekable<_>, pred: fn(char) -> bool| {
            let mut end = start + c.len_utf8();
            while let Some(&(_, (i, next))) = chars.peek() {
                if !pred(next) {
                    break;
                }
                end = i + next.len_utf8();
                chars.next();
            }
            end
        };
        if c.is_whitespace() {
            continue;
        } else if c == '/' {
            out.push((column, Tok::Slash));
        } else if c.is_ascii_digit() {
            let end = run(&mut chars, |c| c.is_ascii_digit());
            out.push((column, Tok::Num(&input[start..end])));
        } else if is_word_char(c) {
            let end = run(&mut chars, is_word_char);
            out.push((column, Tok::Word(&input[start..end])));
        } else {
            let why = match c {
                '.' | ',' => "; counts are whole numbers",
                '-' | '+' => "; counts are positive whole numbers",
                _ => "",
            };
            return Err(ParsePolicyError::at(
                input,
                column,
                format!("unexpected character {c:?}{why}"),
            ));
        }
    }
    Ok(out)
}

fn algorithm_named(word: &str) -> Option<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .find(|a| a.as_str().eq_ignore_ascii_case(word))
}

fn unit_named(word: &str) -> Option<u64> {
    UNITS
        .iter()
        .find(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(word)))
        .map(|(_, micros)| *micros)
}

struct Parser<'a> {
    input: &'a str,
    tokens: Vec<(usize, Tok<'a>)>,
    next: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<(usize, Tok<'a>)> {
        self.tokens.get(self.next).copied()
    }

    fn bump(&mut self) -> Option<(usize, Tok<'a>)> {
        let t = self.peek();
        self.next += usize::from(t.is_some());
        t
    }

    /// The column just past the input, for "expected … at the end".
    fn end_column(&self) -> usize {
        self.input.chars().count() + 1
    }

    fn error(&self, column: usize, reason: String) -> ParsePolicyError {
        ParsePolicyError::at(self.input, column, reason)
    }

    fn count(&mut self, what: &str) -> Result<u32, ParsePolicyError> {
        let (column, n) = self.number(what)?;
        u32::try_from(n).map_err(|_| {
            self.error(
                column,
                format!("{what} {n} is too large (at most {})", u32::MAX),
            )
        })
    }

    fn number(&mut self, what: &str) -> Result<(usize, u64), ParsePolicyError> {
        match self.bump() {
            Some((column, Tok::Num(digits))) => digits
                .parse::<u64>()
                .map(|n| (column, n))
                .map_err(|_| self.error(column, format!("{what} {} is too large", shown(digits)))),
            Some((column, tok)) => {
                Err(self.error(column, format!("expected {what}, a number, found {tok}")))
            }
            None => Err(self.error(
                self.end_column(),
                format!("expected {what}, a number, at the end"),
            )),
        }
    }

    /// `[count] unit`, in microseconds.
    fn period(&mut self) -> Result<u64, ParsePolicyError> {
        let (count_column, count) = match self.peek() {
            Some((_, Tok::Num(_))) => self.number("the period's count")?,
            _ => (0, 1),
        };
        let units = "expected a unit: us, ms, s, min, h, d or w, or a name such as second, \
                     minute, hour or day";
        let micros = match self.bump() {
            Some((column, Tok::Word(word))) => unit_named(word).ok_or_else(|| {
                self.error(column, format!("unknown unit {:?}; {units}", shown(word)))
            })?,
            Some((column, tok)) => return Err(self.error(column, format!("{units}, found {tok}"))),
            None => return Err(self.error(self.end_column(), format!("{units} at the end"))),
        };
        if count == 0 {
            return Err(self.error(count_column, "a period of zero length".into()));
        }
        // Anything past u64 is far past the longest window, which the
        // constructor then names.
        Ok(count.saturating_mul(micros))
    }

    /// One of `words`, or an error saying which was expected.
    fn keyword(&mut self, words: &[&str]) -> Result<(), ParsePolicyError> {
        let expected = words
            .iter()
            .map(|w| format!("{w:?}"))
            .collect::<Vec<_>>()
            .join(" or ");
        match self.bump() {
            Some((_, Tok::Word(w))) if words.iter().any(|k| k.eq_ignore_ascii_case(w)) => Ok(()),
            Some((column, tok)) => {
                Err(self.error(column, format!("expected {expected}, found {tok}")))
            }
            None => Err(self.error(self.end_column(), format!("expected {expected} at the end"))),
        }
    }

    /// What follows `ban`: `after N in P for P [growing xF up to P]`.
    fn ban(&mut self) -> Result<Ban, ParsePolicyError> {
        self.keyword(&["after"])?;
        let after = self.count("a ban's refusal count")?;
        self.keyword(&["in", "within"])?;
        let within = Duration::from_micros(self.period()?);
        self.keyword(&["for"])?;
        let block = Duration::from_micros(self.period()?);
        let refused = |e| ParsePolicyError::refused(self.input, e, None);
        let ban = Ban::new(after, within, block).map_err(refused)?;
        match self.peek() {
            Some((_, Tok::Word(w))) if w.eq_ignore_ascii_case("growing") => {
                self.bump();
                // `x2` is one word and a number: `x` then `2`, or `x 2`.
                self.keyword(&["x"])?;
                let factor = self.count("a ban's growth factor")?;
                self.keyword(&["up"])?;
                self.keyword(&["to"])?;
                let max = Duration::from_micros(self.period()?);
                ban.growing(factor, max)
                    .map_err(|e| ParsePolicyError::refused(self.input, e, None))
            }
            _ => Ok(ban),
        }
    }

    fn policy(&mut self) -> Result<Policy, ParsePolicyError> {
        let algorithm = match self.peek() {
            Some((column, Tok::Word(word))) => {
                self.bump();
                Some(algorithm_named(word).ok_or_else(|| {
                    self.error(
                        column,
                        format!(
                            "unknown algorithm {:?}; expected sliding_log, fixed_window, \
                             sliding_window or gcra",
                            shown(word)
                        ),
                    )
                })?)
            }
            _ => None,
        };
        let limit = self.count("a limit")?;
        match self.bump() {
            Some((_, Tok::Slash)) => {}
            Some((_, Tok::Word(w))) if w.eq_ignore_ascii_case("per") => {}
            Some((column, tok)) => {
                return Err(self.error(column, format!("expected \"/\" or \"per\", found {tok}")));
            }
            None => {
                return Err(self.error(
                    self.end_column(),
                    "expected \"/\" or \"per\" and a period at the end".into(),
                ));
            }
        }
        let per_us = self.period()?;
        let burst = match self.peek() {
            None => None,
            Some((_, Tok::Word(w))) if w.eq_ignore_ascii_case("ban") => None,
            Some((column, Tok::Word(w))) if w.eq_ignore_ascii_case("burst") => {
                self.bump();
                if let Some(a) = algorithm.filter(|a| *a != Algorithm::Gcra) {
                    return Err(self.error(
                        column,
                        format!(
                            "a burst applies to gcra only; {a} admits at most its limit per \
                             window"
                        ),
                    ));
                }
                Some(self.count("a burst")?)
            }
            Some((column, tok)) => {
                return Err(self.error(
                    column,
                    format!(
                        "unexpected {tok} after the period; only \"burst N\" or \"ban …\" may \
                         follow"
                    ),
                ));
            }
        };
        let ban = match self.bump() {
            None => None,
            Some((_, Tok::Word(w))) if w.eq_ignore_ascii_case("ban") => Some(self.ban()?),
            Some((column, tok)) => {
                return Err(self.error(
                    column,
                    format!("unexpected {tok} after the burst; only \"ban …\" may follow"),
                ));
            }
        };
        if let Some((column, tok)) = self.bump() {
            return Err(self.error(column, format!("unexpected {tok} after the ban")));
        }
        let per = Duration::from_micros(per_us);
        let built = match burst {
            Some(burst) => Policy::gcra_with_burst(limit, per, burst),
            None => Policy::new(algorithm.unwrap_or(DEFAULT_ALGORITHM), limit, per),
        };
        built
            .map(|p| ban.map_or(p, |b| p.with_ban(b)))
            .map_err(|e| {
                let hint = match (&e, algorithm) {
                    (ConfigError::LimitTooLarge { .. }, None) if limit > MAX_LOG_LIMIT => {
                        Some(format!(
                            "a policy without an algorithm is a sliding_log; name another for a \
                         larger limit, such as \"sliding_window {limit}/…\""
                        ))
                    }
                    _ => None,
                };
                ParsePolicyError::refused(self.input, e, hint)
            })
    }
}

/// Several policies in one string, separated by `;`: `"10/s; 1000/h"`,
/// the limits of one route, each becoming a rule of one
/// [`Limiter`](crate::Limiter) ([`Rule::tiers`](crate::Rule::tiers)).
/// Each part follows the [grammar](crate::Policy#as-text); an error names the part
/// at fault (its number, from 1, and its text), and its column is counted
/// within the part. Refuses an empty part (`"10/s;;1000/h"`, a trailing
/// `;`) and the same policy twice, which can only be a mistake.
///
/// ```
/// use std::time::Duration;
/// use ratewarden_core::{Policy, parse_policies};
///
/// let limits = parse_policies("10/s; fixed_window 1000/h")?;
/// assert_eq!(limits, [
///     Policy::sliding_log(10, Duration::from_secs(1))?,
///     Policy::fixed_window(1000, Duration::from_secs(3600))?,
/// ]);
///
/// let err = parse_policies("10/s; 1000/fortnight").unwrap_err();
/// assert_eq!(err.part(), Some(2));
/// assert!(err.to_string().contains(r#"part 2 of "10/s; 1000/fortnight""#), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn parse_policies(input: &str) -> Result<Vec<Policy>, ParsePolicyError> {
    let mut policies: Vec<Policy> = Vec::new();
    for (i, part) in input.split(';').enumerate() {
        let n = i + 1;
        if part.trim().is_empty() {
            let reason = if input.trim().is_empty() {
                "no policy; write one or more separated by `;`, such as \"10/s; 1000/h\""
            } else {
                "empty part; separate policies with one `;`, and end the list without one"
            };
            return Err(ParsePolicyError::at(part, 1, reason.into()).in_part(n, input));
        }
        let policy: Policy = part
            .parse()
            .map_err(|e: ParsePolicyError| e.in_part(n, input))?;
        if let Some(first) = policies.iter().position(|p| *p == policy) {
            return Err(ParsePolicyError::at(
                part,
                1,
                format!("the same policy as part {}", first + 1),
            )
            .in_part(n, input));
        }
        policies.push(policy);
    }
    Ok(policies)
}

impl FromStr for Policy {
    type Err = ParsePolicyError;

    /// Parses the [grammar](crate::Policy#as-text).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut parser = Parser {
            input,
            tokens: tokens(input)?,
            next: 0,
        };
        if parser.tokens.is_empty() {
            return Err(ParsePolicyError::at(
                input,
                1,
                "empty policy; write one such as \"60/minute\", \"fixed_window 1000/day\" or \
                 \"gcra 10/s burst 20\""
                    .into(),
            ));
        }
        parser.policy()
    }
}

/// A period in the largest unit that divides it, the count left out when
/// it is 1: `min`, `90s`, `1500ms`.
struct Period(u64);

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, micros) = SHOWN_UNITS
            .iter()
            .copied()
            .find(|(_, m)| self.0.is_multiple_of(*m))
            .unwrap_or(("us", 1));
        match self.0 / micros {
            1 => f.write_str(unit),
            n => write!(f, "{n}{unit}"),
        }
    }
}

/// A [`Period`] with its count even when it is 1 (`1d`): a ban's lengths
/// read as durations, not as a rate's "per minute".
struct Counted(u64);

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = Period(self.0).to_string();
        if shown.starts_with(|c: char| c.is_ascii_digit()) {
            f.write_str(&shown)
        } else {
            write!(f, "1{shown}")
        }
    }
}

impl fmt::Display for Policy {
    /// The policy as text that parses back to it: `sliding_log 60/min`,
    /// `gcra 10/s burst 20`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.algorithm,
            self.rate,
            Period(self.per_us)
        )?;
        if let Some(burst) = self.burst() {
            write!(f, " burst {burst}")?;
        }
        if let Some(ban) = self.ban() {
            write!(
                f,
                " ban after {} in {} for {}",
                ban.after(),
                Counted(ban.within_micros()),
                Counted(ban.block_micros())
            )?;
            if ban.factor() > 1 || ban.max_micros() != ban.block_micros() {
                write!(
                    f,
                    " growing x{} up to {}",
                    ban.factor(),
                    Counted(ban.max_micros())
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Policy {
    /// From the text of the [grammar](crate::Policy#as-text): `"60/minute"`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Policy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy such as \"60/minute\" or \"gcra 10/s burst 20\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Policy, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Policy {
    /// As its `Display` text, which deserializes back to it.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{MAX_LIMIT, MAX_WINDOW, MIN_WINDOW};
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);
    const MINUTE: Duration = Duration::from_secs(60);
    const DAY: Duration = Duration::from_secs(86_400);

    fn parse(s: &str) -> Policy {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn error(s: &str) -> String {
        match s.parse::<Policy>() {
            Ok(p) => panic!("{s:?} should be refused, parsed as {p}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_documented_forms() {
        let per_minute = Policy::sliding_log(60, MINUTE).unwrap();
        for s in [
            "60/minute",
            "60 per minute",
            "60/min",
            "60/1m",
            "60 / 1 min",
            "60 PER Minute",
            "  60/60s ",
            "sliding_log 60/min",
        ] {
            assert_eq!(parse(s), per_minute, "{s}");
        }
        assert_eq!(parse("10/s"), Policy::sliding_log(10, S).unwrap());
        assert_eq!(
            parse("100/1h"),
            Policy::sliding_log(100, Duration::from_secs(3600)).unwrap()
        );
        assert_eq!(
            parse("fixed_window 1000/day"),
            Policy::fixed_window(1000, DAY).unwrap()
        );
        assert_eq!(
            parse("sliding_window 100/90s"),
            Policy::sliding_window(100, Duration::from_secs(90)).unwrap()
        );
        assert_eq!(
            parse("5 per 2 hours"),
            Policy::sliding_log(5, Duration::from_secs(7200)).unwrap()
        );
        assert_eq!(parse("gcra 10/s"), Policy::gcra(10, S).unwrap());
        let burst = Policy::gcra_with_burst(10, S, 20).unwrap();
        assert_eq!(parse("gcra 10/s burst 20"), burst);
        assert_eq!(parse("10/s burst 20"), burst, "a burst implies gcra");
        assert_eq!(
            parse("3/250ms"),
            Policy::sliding_log(3, Duration::from_millis(250)).unwrap()
        );
        assert_eq!(
            parse("1/2w"),
            Policy::sliding_log(1, Duration::from_secs(14 * 86_400)).unwrap()
        );
        assert_eq!(parse("1/1500us").window(), Duration::from_micros(1500));
        assert_eq!(parse("1/1500µs").window(), Duration::from_micros(1500));
    }

    #[test]
    fn bans_parse_display_and_refuse_what_ban_new_refuses() {
        let ban = Ban::new(3, 10 * MINUTE, 15 * MINUTE).unwrap();
        let login = Policy::fixed_window(5, MINUTE).unwrap().with_ban(ban);
        for s in [
            "fixed_window 5/min ban after 3 in 10min for 15min",
            "fixed_window 5/min BAN after 3 within 10 minutes for 900s",
        ] {
            assert_eq!(parse(s), login, "{s}");
        }
        let text = "fixed_window 5/min ban after 3 in 10min for 15min";
        assert_eq!(login.to_string(), text);
        let growing = login.with_ban(ban.growing(2, DAY).unwrap());
        let text = "fixed_window 5/min ban after 3 in 10min for 15min growing x2 up to 1d";
        assert_eq!(growing.to_string(), text);
        assert_eq!(parse(text), growing);
        assert_eq!(
            parse("gcra 10/s burst 20 ban after 1 in 1s for 1min growing x 3 up to 1h")
                .ban()
                .map(|b| (b.after(), b.factor(), b.max())),
            Some((1, 3, Duration::from_secs(3600)))
        );
        for (input, expected) in [
            ("5/min ban", "expected \"after\" at the end"),
            (
                "5/min ban after 0 in 1min for 1min",
                "refusal count must be from 1",
            ),
            (
                "5/min ban after 3 for 1min",
                "expected \"in\" or \"within\", found \"for\"",
            ),
            (
                "5/min ban after 3 in 1min for 1min growing x2 up to 30s",
                "longest length",
            ),
            (
                "5/min ban after 3 in 1min for 1min soon",
                "unexpected \"soon\" after the ban",
            ),
            ("5/min soon", "only \"burst N\" or \"ban …\" may follow"),
        ] {
            let e = error(input);
            assert!(e.contains(expected), "{input:?}: {e}");
        }
    }

    #[test]
    fn display_names_the_algorithm_and_the_largest_unit() {
        for (policy, text) in [
            (Policy::sliding_log(60, MINUTE), "sliding_log 60/min"),
            (Policy::fixed_window(1000, DAY), "fixed_window 1000/d"),
            (
                Policy::sliding_window(100, Duration::from_secs(90)),
                "sliding_window 100/90s",
            ),
            (
                Policy::gcra(3, Duration::from_millis(1500)),
                "gcra 3/1500ms",
            ),
            (
                Policy::gcra(3, Duration::from_micros(1_000_001)),
                "gcra 3/1000001us",
            ),
            (Policy::gcra_with_burst(10, S, 20), "gcra 10/s burst 20"),
            (Policy::gcra_with_burst(10, S, 10), "gcra 10/s"),
            (Policy::gcra_with_burst(1, 2 * S, 1), "gcra 1/2s"),
        ] {
            assert_eq!(policy.unwrap().to_string(), text);
        }
    }

    #[test]
    fn errors_say_what_is_wrong_and_where() {
        for (input, expected) in [
            ("", "empty policy"),
            ("   ", "empty policy"),
            ("60", "expected \"/\" or \"per\" and a period at the end"),
            ("60/", "expected a unit"),
            ("60/fortnight", "at column 4: unknown unit \"fortnight\""),
            ("/minute", "expected a limit, a number, found \"/\""),
            (
                "token_bucket 60/min",
                "at column 1: unknown algorithm \"token_bucket\"",
            ),
            ("60 each minute", "at column 4: expected \"/\" or \"per\""),
            (
                "1.5/s",
                "at column 2: unexpected character '.'; counts are whole",
            ),
            ("-1/s", "unexpected character '-'"),
            ("60/0s", "a period of zero length"),
            (
                "99999999999/s",
                "a limit 99999999999 is too large (at most 4294967295)",
            ),
            (
                "1/99999999999999999999s",
                "the period's count 99999999999999999999 is too large",
            ),
            ("1/9999999999999999999s", "window must be at most"),
            (
                "sliding_log 10/s burst 20",
                "a burst applies to gcra only; sliding_log",
            ),
            ("gcra 10/s burst", "expected a burst, a number, at the end"),
            ("gcra 10/s burst 20 30", "unexpected \"30\" after the burst"),
            ("60/min please", "unexpected \"please\" after the period"),
            ("0/min", "limit must be at least 1"),
            ("1/500us", "window must be at least 1ms"),
            ("1/400d", "window must be at most"),
            ("gcra 2000/ms", "too large for gcra"),
            (
                "20000/h",
                "a policy without an algorithm is a sliding_log; name another for a larger \
                 limit, such as \"sliding_window 20000/…\"",
            ),
            ("gcra 0/s burst 5", "rate must be at least 1"),
            ("gcra 5/s burst 0", "burst must be at least 1"),
            (
                "gcra 1/d burst 1000",
                "a burst of 1000 at 1 per 86400s takes",
            ),
        ] {
            let e = error(input);
            assert!(e.contains(expected), "{input:?}: {e}");
            assert!(e.starts_with(&format!("invalid policy {input:?}: ")), "{e}");
        }
        // A long input is not echoed whole.
        let long = format!("{}x", "1".repeat(1000));
        assert!(error(&long).len() < 400);
        // The constructor's error is kept as the source.
        let e = "0/min".parse::<Policy>().unwrap_err();
        assert_eq!(e.config_error(), Some(&ConfigError::ZeroLimit));
        assert_eq!(e.column(), None);
        assert_eq!(
            "60/fortnight".parse::<Policy>().unwrap_err().column(),
            Some(4)
        );
    }

    #[test]
    fn a_burst_keeps_the_exact_emission_interval() {
        // 3 per second does not divide a second into whole microseconds:
        // the interval rounds down to 333_333 µs, as gcra(3, 1 s) rounds it,
        // and the window is ⌊5·10⁶/3⌋ = 1_666_666 µs, whose interval over a
        // limit of 5 is that same 333_333 µs.
        let p = Policy::gcra_with_burst(3, S, 5).unwrap();
        assert_eq!(p.limit(), 5);
        assert_eq!(p.window_micros(), 1_666_666);
        assert_eq!(
            p.emission_interval_micros(),
            Policy::gcra(3, S).unwrap().emission_interval_micros()
        );
        assert_eq!(p.burst(), Some(5));
        assert_eq!((p.rate(), p.per()), (3, S));
        assert_eq!(Policy::gcra_with_burst(3, S, 3), Policy::gcra(3, S));
        assert_eq!(Policy::gcra(3, S).unwrap().burst(), None);
        assert!(Policy::gcra_with_burst(2_000_000, S, 5).is_err());
        assert!(Policy::gcra_with_burst(1, S, MAX_LIMIT + 1).is_err());
    }

    fn any_policy() -> impl Strategy<Value = Policy> {
        let min = MIN_WINDOW.as_micros() as u64;
        let max = MAX_WINDOW.as_micros() as u64;
        // Round periods as people write them, and any microsecond count.
        let period = prop_oneof![
            (
                1u64..=1000,
                prop::sample::select(vec![
                    1_000u64,
                    1_000_000,
                    60_000_000,
                    3_600_000_000,
                    MICROS_PER_DAY
                ])
            )
                .prop_map(|(n, unit)| n * unit),
            min..=max,
        ];
        let limit = prop_oneof![1u32..=100, 1u32..=MAX_LIMIT];
        prop_oneof![
            (
                prop::sample::select(Algorithm::ALL.to_vec()),
                limit.clone(),
                period.clone()
            )
                .prop_filter_map("refused by the constructor", |(a, l, w)| {
                    Policy::new(a, l, Duration::from_micros(w)).ok()
                }),
            (limit.clone(), period, limit)
                .prop_filter_map("refused by the constructor", |(r, p, b)| {
                    Policy::gcra_with_burst(r, Duration::from_micros(p), b).ok()
                }),
        ]
    }

    proptest! {
        #[test]
        fn display_round_trips(policy in any_policy()) {
            let text = policy.to_string();
            let parsed: Policy = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(parsed, policy, "{}", text);
            prop_assert_eq!(parsed.to_string(), text);
        }

        #[test]
        fn any_text_parses_or_says_why(text in "[a-z_ ]{0,14}[0-9]{0,12}[ /a-zµ]{0,6}[0-9]{0,4}[a-z ]{0,8}[0-9]{0,3}") {
            match text.parse::<Policy>() {
                Ok(p) => prop_assert_eq!(p.to_string().parse::<Policy>().ok(), Some(p)),
                Err(e) => prop_assert!(e.to_string().starts_with("invalid policy")),
            }
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn deserializes_from_text() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};

        let de: StrDeserializer<'_, Error> = "gcra 10/s burst 20".into_deserializer();
        let p = Policy::deserialize(de).unwrap();
        assert_eq!(p, Policy::gcra_with_burst(10, S, 20).unwrap());
        let de: StrDeserializer<'_, Error> = "60/fortnight".into_deserializer();
        let e = Policy::deserialize(de).unwrap_err().to_string();
        assert!(e.contains("unknown unit \"fortnight\""), "{e}");
    }
}
