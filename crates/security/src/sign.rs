//! Request signatures as the RocketMQ 5 clients make them.
//!
//! Every call carries two headers:
//! - `x-mq-date-time`: the time of signing, `20261205T061020Z` (the clients' form) or RFC 3339
//!   `2026-12-05T06:10:20Z` (fractional seconds allowed);
//! - `authorization`: `MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
//!   Signature=<hex of HMAC-SHA1(secret, the date header's exact text)>`.
//!
//! The server takes a signature only while its date lies within a window of its own clock, so a
//! captured header stops working once the window has passed. No error message ever holds a
//! secret or a signature.

use ring::hmac;

/// The header that carries the credential and the signature.
pub const AUTHORIZATION: &str = "authorization";
/// The signed header: the time of signing.
pub const DATE_TIME: &str = "x-mq-date-time";
/// The one algorithm the clients use.
pub const ALGORITHM: &str = "MQv2-HMAC-SHA1";
/// The default window, either side of the server's clock, in which a signature's date is taken.
pub const WINDOW_SECS_DEFAULT: u64 = 15 * 60;

/// Why a request's signature was not taken. The text names what is wrong, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// No `authorization` header.
    #[error("the request is not signed: no `authorization` header")]
    MissingAuthorization,
    /// No `x-mq-date-time` header.
    #[error("the request is not signed: no `x-mq-date-time` header")]
    MissingDate,
    /// The `authorization` header does not parse.
    #[error("malformed `authorization` header: {0}")]
    Malformed(&'static str),
    /// The date header does not parse.
    #[error("malformed `x-mq-date-time` header: expected 20261205T061020Z or 2026-12-05T06:10:20Z")]
    BadDate,
    /// The date lies outside the window.
    #[error(
        "signature date is {skew_secs} s from the server's clock (window {window_secs} s): expired or replayed"
    )]
    Stale {
        /// How far the date is from the server's clock, in seconds.
        skew_secs: u64,
        /// The window.
        window_secs: u64,
    },
    /// No user has this access key.
    #[error("unknown access key {0:?}")]
    UnknownUser(String),
    /// The signature does not match the secret of the access key.
    #[error("signature does not match for access key {0:?}")]
    BadSignature(String),
}

/// A parsed `authorization` header (borrowed from the header's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization<'a> {
    /// `Credential`: the access key.
    pub access_key: &'a str,
    /// `SignedHeaders`: always `x-mq-date-time` for the clients.
    pub signed_headers: &'a str,
    /// `Signature`: hex of the HMAC.
    pub signature: &'a str,
}

/// Parses `MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=HEX`. The
/// fields may come in any order, separated by commas and spaces; each must appear once.
pub fn parse_authorization(value: &str) -> Result<Authorization<'_>, SignError> {
    let rest = value
        .trim()
        .strip_prefix(ALGORITHM)
        .ok_or(SignError::Malformed("the algorithm is not MQv2-HMAC-SHA1"))?;
    if !rest.starts_with(' ') {
        return Err(SignError::Malformed("the algorithm is not MQv2-HMAC-SHA1"));
    }
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (key, val) = part
            .split_once('=')
            .ok_or(SignError::Malformed("a field is not key=value"))?;
        let slot = match key.trim() {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed,
            "Signature" => &mut signature,
            _ => return Err(SignError::Malformed("unknown field")),
        };
        if slot.replace(val.trim()).is_some() {
            return Err(SignError::Malformed("a field appears twice"));
        }
    }
    let access_key = credential.ok_or(SignError::Malformed("no Credential"))?;
    let signed_headers = signed.ok_or(SignError::Malformed("no SignedHeaders"))?;
    let signature = signature.ok_or(SignError::Malformed("no Signature"))?;
    if access_key.is_empty() {
        return Err(SignError::Malformed("empty Credential"));
    }
    if !signed_headers
        .split(';')
        .any(|h| h.eq_ignore_ascii_case(DATE_TIME))
    {
        return Err(SignError::Malformed(
            "SignedHeaders does not name x-mq-date-time",
        ));
    }
    if signature.is_empty() || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SignError::Malformed("Signature is not hex"));
    }
    Ok(Authorization {
        access_key,
        signed_headers,
        signature,
    })
}

/// The hex HMAC-SHA1 of `date_time` keyed by `secret`, as the clients compute it.
pub fn sign(secret: &str, date_time: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
    hex(hmac::sign(&key, date_time.as_bytes()).as_ref())
}

/// Whether `signature` (hex, either case) is the HMAC of `date_time` under `secret`, compared in
/// constant time.
pub fn verify(secret: &str, date_time: &str, signature: &str) -> bool {
    let Some(tag) = unhex(signature) else {
        return false;
    };
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
    hmac::verify(&key, date_time.as_bytes(), &tag).is_ok()
}

/// The `authorization` header value for `access_key` over `date_time`.
pub fn authorization(access_key: &str, secret: &str, date_time: &str) -> String {
    format!(
        "{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={}",
        sign(secret, date_time)
    )
}

/// Checks the headers of one request against the users `secret_of` knows and the server's clock
/// `now_secs` (Unix seconds); returns the access key on success.
pub fn check<'a>(
    authorization: Option<&'a str>,
    date_time: Option<&str>,
    now_secs: u64,
    window_secs: u64,
    secret_of: impl FnOnce(&str) -> Option<String>,
) -> Result<&'a str, SignError> {
    let auth = parse_authorization(authorization.ok_or(SignError::MissingAuthorization)?)?;
    let date_text = date_time.ok_or(SignError::MissingDate)?;
    let date = parse_date_time(date_text)?;
    let skew_secs = date.abs_diff(now_secs);
    if skew_secs > window_secs {
        return Err(SignError::Stale {
            skew_secs,
            window_secs,
        });
    }
    let secret =
        secret_of(auth.access_key).ok_or_else(|| SignError::UnknownUser(auth.access_key.into()))?;
    if !verify(&secret, date_text, auth.signature) {
        return Err(SignError::BadSignature(auth.access_key.into()));
    }
    Ok(auth.access_key)
}

/// A user's access key and secret, as a client holds them. `{:?}` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key.
    pub access_key: String,
    /// The secret key.
    pub secret: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Credentials {
    /// Signs a request now: sets `x-mq-date-time` and `authorization`.
    pub fn sign_request<T>(&self, req: &mut tonic::Request<T>) {
        let date = format_date_time(now_secs());
        let auth = authorization(&self.access_key, &self.secret, &date);
        let md = req.metadata_mut();
        if let (Ok(d), Ok(a)) = (date.parse(), auth.parse()) {
            md.insert(DATE_TIME, d);
            md.insert(AUTHORIZATION, a);
        }
    }
}

/// A tonic interceptor that signs every request with the credentials it holds (none: passes
/// requests through unsigned).
#[derive(Clone, Debug, Default)]
pub struct Signer(pub Option<std::sync::Arc<Credentials>>);

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = &self.0 {
            c.sign_request(&mut req);
        }
        Ok(req)
    }
}

/// `20261205T061020Z` for a Unix time in seconds (UTC).
pub fn format_date_time(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Parses `20261205T061020Z` or RFC 3339 `2026-12-05T06:10:20[.fff]Z` (UTC) to Unix seconds.
pub fn parse_date_time(text: &str) -> Result<u64, SignError> {
    let b = text.as_bytes();
    let num = |s: &[u8]| -> Result<u32, SignError> {
        if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
            return Err(SignError::BadDate);
        }
        Ok(s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (y, mo, d, h, mi, s) = if b.len() == 16 && b[8] == b'T' && b[15] == b'Z' {
        (
            num(&b[0..4])?,
            num(&b[4..6])?,
            num(&b[6..8])?,
            num(&b[9..11])?,
            num(&b[11..13])?,
            num(&b[13..15])?,
        )
    } else if b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[b.len() - 1] == b'Z'
    {
        let frac = &b[19..b.len() - 1];
        if !frac.is_empty() && (frac[0] != b'.' || num(&frac[1..]).is_err()) {
            return Err(SignError::BadDate);
        }
        (
            num(&b[0..4])?,
            num(&b[5..7])?,
            num(&b[8..10])?,
            num(&b[11..13])?,
            num(&b[14..16])?,
            num(&b[17..19])?,
        )
    } else {
        return Err(SignError::BadDate);
    };
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || d == 0
        || d > days_in_month(y, mo)
        || h > 23
        || mi > 59
        || s > 60
    {
        return Err(SignError::BadDate);
    }
    let days = days_from_civil(i64::from(y), mo, d);
    Ok(days as u64 * 86_400 + u64::from(h) * 3600 + u64::from(mi) * 60 + u64::from(s))
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let val = |c: u8| (c as char).to_digit(16);
    b.chunks(2)
        .map(|p| Some((val(p[0])? * 16 + val(p[1])?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // RFC 2202 test case 2 for HMAC-SHA1.
    #[test]
    fn t1_hmac_sha1_matches_rfc_2202() {
        assert_eq!(
            sign("Jefe", "what do ya want for nothing?"),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert!(verify(
            "Jefe",
            "what do ya want for nothing?",
            "EFFCDF6AE5EB2FA2D27416D5F184DF9C259A7C79"
        ));
        assert!(!verify(
            "Jefe",
            "what do ya want for nothing!",
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        ));
    }

    #[test]
    fn t2_the_clients_header_parses() {
        let h = "MQv2-HMAC-SHA1 Credential=ak1, SignedHeaders=x-mq-date-time, Signature=0a1B";
        let a = parse_authorization(h).unwrap();
        assert_eq!((a.access_key, a.signature), ("ak1", "0a1B"));
        for bad in [
            "",
            "MQv2-HMAC-SHA1",
            "MQv2-HMAC-SHA256 Credential=a, SignedHeaders=x-mq-date-time, Signature=00",
            "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=00",
            "MQv2-HMAC-SHA1 Credential=a, SignedHeaders=host, Signature=00",
            "MQv2-HMAC-SHA1 Credential=a, SignedHeaders=x-mq-date-time, Signature=zz",
            "MQv2-HMAC-SHA1 Credential=a, Credential=b, SignedHeaders=x-mq-date-time, Signature=00",
            "MQv2-HMAC-SHA1Credential=a, SignedHeaders=x-mq-date-time, Signature=00",
        ] {
            assert!(parse_authorization(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn t3_both_date_forms_parse_to_the_same_time() {
        let t = parse_date_time("20261205T061020Z").unwrap();
        assert_eq!(t, parse_date_time("2026-12-05T06:10:20Z").unwrap());
        assert_eq!(t, parse_date_time("2026-12-05T06:10:20.123Z").unwrap());
        assert_eq!(t, 1_796_451_020);
        assert_eq!(format_date_time(t), "20261205T061020Z");
        for bad in [
            "20261305T061020Z",
            "20260230T000000Z",
            "2026-12-05 06:10:20Z",
            "2026-12-05T06:10:20.Z",
            "x",
        ] {
            assert_eq!(parse_date_time(bad), Err(SignError::BadDate), "{bad}");
        }
    }

    #[test]
    fn t4_check_names_each_refusal() {
        let now = 1_796_451_020;
        let date = format_date_time(now);
        let good = authorization("ak", "sk", &date);
        let secret = |ak: &str| (ak == "ak").then(|| "sk".to_string());
        assert_eq!(check(Some(&good), Some(&date), now, 900, secret), Ok("ak"));
        assert_eq!(
            check(None, Some(&date), now, 900, secret),
            Err(SignError::MissingAuthorization)
        );
        assert_eq!(
            check(Some(&good), None, now, 900, secret),
            Err(SignError::MissingDate)
        );
        let replay = check(Some(&good), Some(&date), now + 901, 900, secret);
        assert!(matches!(
            replay,
            Err(SignError::Stale { skew_secs: 901, .. })
        ));
        let wrong = authorization("ak", "other", &date);
        let e = check(Some(&wrong), Some(&date), now, 900, secret).unwrap_err();
        assert_eq!(e, SignError::BadSignature("ak".into()));
        assert!(!e.to_string().contains("sk"));
        let stranger = authorization("nobody", "sk", &date);
        assert_eq!(
            check(Some(&stranger), Some(&date), now, 900, secret),
            Err(SignError::UnknownUser("nobody".into()))
        );
    }

    proptest! {
        // The parser never panics, and whatever it takes it gives back unchanged.
        #[test]
        fn t5_authorization_parser_total(s in ".{0,120}") {
            if let Ok(a) = parse_authorization(&s) {
                prop_assert!(!a.access_key.is_empty());
                prop_assert!(a.signature.bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }

        #[test]
        fn t6_signed_headers_round_trip(ak in "[A-Za-z0-9_]{1,20}", sk in ".{0,40}", t in 0u64..253_402_300_799) {
            let date = format_date_time(t);
            prop_assert_eq!(parse_date_time(&date), Ok(t));
            let h = authorization(&ak, &sk, &date);
            let got = check(Some(&h), Some(&date), t, 0, |k| (k == ak).then(|| sk.clone()));
            prop_assert_eq!(got, Ok(ak.as_str()));
        }

        #[test]
        fn t7_date_parser_total(s in "[0-9TZ:.-]{0,30}") {
            if let Ok(t) = parse_date_time(&s) {
                prop_assert!(t < 253_402_300_861);
            }
        }
    }
}
