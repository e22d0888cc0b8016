//! The little HTTP/1.1 the dashboard speaks: one `GET` per connection (`Connection: close`),
//! a request head of at most [`MAX_HEAD`] bytes read within [`READ_TIMEOUT`], no body, no
//! folded headers, no absolute-form targets. Anything else is refused with its status code.
//! A browser on loopback needs no more, and a strict parser leaves little to get wrong.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest request head accepted.
pub const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Every response carries these: a Content-Security-Policy that allows only the dashboard's
/// own script and style files (no inline script, no other origin, no framing), no MIME
/// sniffing, no referrer (a URL may carry the token), nothing cached.
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The path, percent-decoded.
    pub path: String,
    /// The query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The header fields; names in lower case.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The first query parameter named `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of cookie `name`.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "cookie")
            .flat_map(|(_, v)| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// Why a request was refused before it was routed; each maps to a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed (400).
    BadRequest,
    /// A method other than GET (405).
    MethodNotAllowed,
    /// The head is too large (431).
    TooLarge,
    /// Not HTTP/1.x (505).
    Version,
}

impl Refusal {
    /// The status code.
    pub fn status(self) -> u16 {
        match self {
            Refusal::BadRequest => 400,
            Refusal::MethodNotAllowed => 405,
            Refusal::TooLarge => 431,
            Refusal::Version => 505,
        }
    }
}

/// Reads one request head from `stream`. `Ok(None)` when the peer closed or timed out before
/// sending one.
pub async fn read_request(
    stream: &mut (impl AsyncRead + Unpin),
) -> Result<Option<Request>, Refusal> {
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 2048];
        loop {
            if let Some(end) = find_end(&head) {
                head.truncate(end);
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Err(Refusal::TooLarge);
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Ok(false),
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    match read {
        Ok(Ok(true)) => parse(&head).map(Some),
        Ok(Ok(false)) | Err(_) => Ok(None),
        Ok(Err(refusal)) => Err(refusal),
    }
}

fn find_end(head: &[u8]) -> Option<usize> {
    head.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Parses a request head (without its final blank line).
pub fn parse(head: &[u8]) -> Result<Request, Refusal> {
    let text = std::str::from_utf8(head).map_err(|_| Refusal::BadRequest)?;
    let mut lines = text.split("\r\n");
    let line = lines.next().ok_or(Refusal::BadRequest)?;
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(Refusal::BadRequest);
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(Refusal::Version);
    }
    if method != "GET" {
        return Err(Refusal::MethodNotAllowed);
    }
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(Refusal::BadRequest);
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let path = decode(path).ok_or(Refusal::BadRequest)?;
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or(Refusal::BadRequest)?;
    let mut headers = Vec::new();
    for line in lines {
        // Obsolete line folding and malformed fields are refused, not guessed at.
        let (name, value) = line.split_once(':').ok_or(Refusal::BadRequest)?;
        if name.is_empty()
            || line.starts_with([' ', '\t'])
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        {
            return Err(Refusal::BadRequest);
        }
        let name = name.to_ascii_lowercase();
        let value = value.trim().to_owned();
        // A GET carries no body here; one announced is a request smuggling attempt or a bug.
        if name == "transfer-encoding" || (name == "content-length" && value != "0") {
            return Err(Refusal::BadRequest);
        }
        headers.push((name, value));
    }
    Ok(Request {
        path,
        query,
        headers,
    })
}

/// Percent-decodes `s` (`+` is a space in queries and harmless in paths); `None` when it is
/// malformed, not UTF-8, or decodes to a control character (nothing the dashboard serves has
/// one, and a CR LF must never reach a header it echoes).
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    if out.iter().any(|b| b.is_ascii_control()) {
        return None;
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A complete response.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Further header fields.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// An HTML page.
    pub fn html(status: u16, body: String) -> Self {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: body.into_bytes(),
        }
    }

    /// A plain text answer.
    pub fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// A redirect (303) to `location`.
    pub fn see_other(location: String) -> Self {
        let mut r = Response::text(303, "");
        r.headers.push(("Location", location));
        r
    }

    /// Writes the response and closes the exchange.
    pub async fn write(self, out: &mut (impl AsyncWrite + Unpin)) -> std::io::Result<()> {
        let mut head = status_line(self.status);
        head.push_str(&format!("Content-Type: {}\r\n", self.content_type));
        head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        push_common(&mut head);
        out.write_all(head.as_bytes()).await?;
        out.write_all(&self.body).await?;
        out.flush().await
    }
}

/// The head of a `text/event-stream` response (no length: it lasts as long as the page).
pub fn event_stream_head() -> String {
    let mut head = status_line(200);
    head.push_str("Content-Type: text/event-stream; charset=utf-8\r\n");
    push_common(&mut head);
    head
}

fn status_line(status: u16) -> String {
    let reason = match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    };
    format!("HTTP/1.1 {status} {reason}\r\n")
}

fn push_common(head: &mut String) {
    for (name, value) in SECURITY_HEADERS {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_is_parsed() {
        let r = parse(
            b"GET /spaces/main/feed?channel=team%2Eops&token=ab+c HTTP/1.1\r\nHost: x\r\nCookie: a=1; cotald_4280=tok",
        )
        .unwrap();
        assert_eq!(r.path, "/spaces/main/feed");
        assert_eq!(r.param("channel"), Some("team.ops"));
        assert_eq!(r.param("token"), Some("ab c"));
        assert_eq!(r.cookie("cotald_4280"), Some("tok"));
        assert_eq!(r.header("host"), Some("x"));
    }

    #[test]
    fn what_is_not_a_plain_get_is_refused() {
        for (head, refusal) in [
            (&b"POST / HTTP/1.1"[..], Refusal::MethodNotAllowed),
            (b"GET / HTTP/2", Refusal::Version),
            (b"GET http://x/ HTTP/1.1", Refusal::BadRequest),
            (b"GET / HTTP/1.1\r\nContent-Length: 5", Refusal::BadRequest),
            (
                b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked",
                Refusal::BadRequest,
            ),
            (b"GET / HTTP/1.1\r\nA: b\r\n folded", Refusal::BadRequest),
            (b"GET /%zz HTTP/1.1", Refusal::BadRequest),
            (b"GET /a%0d%0aSet-Cookie:x HTTP/1.1", Refusal::BadRequest),
            (b"GET /?channel=%00 HTTP/1.1", Refusal::BadRequest),
            (b"GET /  HTTP/1.1", Refusal::BadRequest),
        ] {
            assert_eq!(
                parse(head),
                Err(refusal),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused() {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        let mut reader = &big[..];
        assert_eq!(read_request(&mut reader).await, Err(Refusal::TooLarge));
    }

    #[test]
    fn encode_round_trips() {
        assert_eq!(decode(&encode("a b/ü&=")).unwrap(), "a b/ü&=");
    }
}
