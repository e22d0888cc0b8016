//! The dashboard's HTTP, on hyper (HTTP/1.1): each request read into the little the dashboard
//! looks at (method, path, query, headers, and for a `POST` a bounded form body), each answer
//! given with the same security headers. A server a browser talks to belongs on a well-kept
//! HTTP stack; what is left here is the dashboard's own strictness: only `GET` and form
//! `POST`s, no absolute-form targets, no control character in anything decoded (a CR LF must
//! never reach a header the dashboard echoes), a body of at most [`MAX_BODY`] bytes. The
//! decoding itself is well-kept code too: queries and forms as the WHATWG URL Standard reads
//! them (`form_urlencoded`, what a browser does), the path by `percent-encoding`; the
//! addresses the pages link to are encoded by the same crates.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use tokio::sync::mpsc;

/// The largest form body accepted.
pub(super) const MAX_BODY: usize = 64 * 1024;
/// How long a client may take to send its request head.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Every response carries these: a Content-Security-Policy that allows only the dashboard's
/// own script and style files (no inline script, no other origin, no framing, forms posted
/// only to itself), no MIME sniffing, no referrer to any other site (a URL may carry the
/// token; within the dashboard the browser then names the origin of a form, which is
/// checked), nothing cached.
pub(super) const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
];

/// The methods served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    /// Pages, assets, the event streams.
    Get,
    /// A form: post, DM, task.
    Post,
}

/// A request as the dashboard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    /// `GET` or `POST`.
    pub method: Method,
    /// The path, percent-decoded.
    pub path: String,
    /// The query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The header fields; names in lower case.
    pub headers: Vec<(String, String)>,
    /// A `POST`'s form fields, decoded, in order (line ends allowed in values: a message may
    /// have several lines).
    pub form: Vec<(String, String)>,
}

impl Request {
    /// The first query parameter named `name`.
    pub(super) fn param(&self, name: &str) -> Option<&str> {
        first(&self.query, name)
    }

    /// The first form field named `name`.
    pub(super) fn field(&self, name: &str) -> Option<&str> {
        first(&self.form, name)
    }

    /// The first header named `name` (lower case).
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        first(&self.headers, name)
    }

    /// The value of cookie `name`.
    pub(super) fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "cookie")
            .flat_map(|(_, v)| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

fn first<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Why a request was refused before it was routed; each maps to a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Malformed (400).
    BadRequest,
    /// A method other than GET and POST (405).
    MethodNotAllowed,
    /// A body over [`MAX_BODY`] (413).
    TooLarge,
    /// A `POST` body that is not a form (415).
    NotAForm,
}

impl Refusal {
    /// The status code.
    pub(super) fn status(self) -> u16 {
        match self {
            Refusal::BadRequest => 400,
            Refusal::MethodNotAllowed => 405,
            Refusal::TooLarge => 413,
            Refusal::NotAForm => 415,
        }
    }

    /// What the answer says.
    pub(super) fn text(self) -> &'static str {
        match self {
            Refusal::BadRequest => "malformed request",
            Refusal::MethodNotAllowed => "only GET and form POSTs are served",
            Refusal::TooLarge => "request body too large",
            Refusal::NotAForm => "a POST carries an application/x-www-form-urlencoded form",
        }
    }
}

/// Reads what the dashboard needs of `req`, its form body included.
pub(super) async fn read(req: hyper::Request<Incoming>) -> Result<Request, Refusal> {
    let (head, body) = req.into_parts();
    let method = match head.method {
        hyper::Method::GET => Method::Get,
        hyper::Method::POST => Method::Post,
        _ => return Err(Refusal::MethodNotAllowed),
    };
    if head.uri.authority().is_some() || head.uri.scheme().is_some() {
        return Err(Refusal::BadRequest);
    }
    let path = decode_path(head.uri.path()).ok_or(Refusal::BadRequest)?;
    let query = pairs(head.uri.query().unwrap_or(""), false).ok_or(Refusal::BadRequest)?;
    let mut headers = Vec::with_capacity(head.headers.len());
    for (name, value) in &head.headers {
        let value = value.to_str().map_err(|_| Refusal::BadRequest)?;
        headers.push((name.as_str().to_owned(), value.trim().to_owned()));
    }
    let form = match method {
        Method::Get => {
            if first(&headers, "content-length").is_some_and(|l| l != "0")
                || first(&headers, "transfer-encoding").is_some()
            {
                // A GET carries no body here; one announced is smuggling or a bug.
                return Err(Refusal::BadRequest);
            }
            Vec::new()
        }
        Method::Post => {
            let form_type = first(&headers, "content-type").is_some_and(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim() == "application/x-www-form-urlencoded")
            });
            if !form_type {
                return Err(Refusal::NotAForm);
            }
            let bytes = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|_| Refusal::TooLarge)?
                .to_bytes();
            let text = std::str::from_utf8(&bytes).map_err(|_| Refusal::BadRequest)?;
            pairs(text, true).ok_or(Refusal::BadRequest)?
        }
    };
    Ok(Request {
        method,
        path,
        query,
        headers,
        form,
    })
}

/// `a=b&c=d` as the WHATWG URL Standard decodes `application/x-www-form-urlencoded` (a
/// browser's own reading, by `form_urlencoded`): `+` is a space, a malformed `%` escape stays as
/// written, bytes that are not UTF-8 become U+FFFD. `None` when a name or a value decodes to a
/// control character (line ends and tabs allowed in values when `multiline`: a message's text).
fn pairs(text: &str, multiline: bool) -> Option<Vec<(String, String)>> {
    form_urlencoded::parse(text.as_bytes())
        .map(|(k, v)| {
            (clean(&k, false) && clean(&v, multiline)).then(|| (k.into_owned(), v.into_owned()))
        })
        .collect()
}

/// The request path percent-decoded (RFC 3986: a `+` is a plus here, a malformed escape stays
/// as written); `None` when it is not UTF-8 or decodes to a control character.
fn decode_path(path: &str) -> Option<String> {
    let path = percent_decode_str(path).decode_utf8().ok()?;
    clean(&path, false).then(|| path.into_owned())
}

/// Whether `s` holds no control character (but line ends and tabs when `multiline`).
fn clean(s: &str, multiline: bool) -> bool {
    s.chars()
        .all(|c| !c.is_ascii_control() || (multiline && matches!(c, '\n' | '\r' | '\t')))
}

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The address of a space's page: `/spaces/<space>/<page>`, then `query` form-encoded.
pub(super) fn space_url(space: &str, page: &str, query: &[(&str, &str)]) -> String {
    let path = format!("/spaces/{}/{page}", utf8_percent_encode(space, SEGMENT));
    with_query(path, query)
}

/// `path` (decoded) as an address on this site: each segment percent-encoded, then `query`
/// form-encoded. Always a path (`//host` would leave the site).
pub(super) fn site_url(path: &str, query: &[(&str, &str)]) -> String {
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
        .collect();
    with_query(format!("/{}", segments.join("/")), query)
}

fn with_query(path: String, query: &[(&str, &str)]) -> String {
    if query.is_empty() {
        return path;
    }
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(query)
        .finish();
    format!("{path}?{query}")
}

/// What hyper sends: a whole body, or an event stream.
pub(super) type Answer = hyper::Response<BoxBody<Bytes, Infallible>>;

/// A complete response.
pub(super) struct Response {
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
    /// An HTML page: markup only (what `maud::html!` made, every string in it escaped).
    pub(super) fn html(status: u16, page: maud::Markup) -> Self {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: page.into_string().into_bytes(),
        }
    }

    /// A plain text answer.
    pub(super) fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// A redirect (303) to `location`.
    pub(super) fn see_other(location: String) -> Self {
        let mut r = Response::text(303, "");
        r.headers.push(("Location", location));
        r
    }

    /// The answer hyper sends.
    pub(super) fn answer(self) -> Answer {
        let mut builder = with_security(hyper::Response::builder().status(self.status))
            .header("Content-Type", self.content_type);
        for (name, value) in &self.headers {
            builder = builder.header(*name, value);
        }
        builder
            .body(Full::new(Bytes::from(self.body)).boxed())
            .unwrap_or_else(|_| internal_error())
    }
}

/// A `text/event-stream` answer whose chunks come from `chunks`, for as long as the page
/// listens (its end drops the receiver, which the sender notices at its next chunk).
pub(super) fn event_stream(chunks: mpsc::Receiver<Bytes>) -> Answer {
    let frames = futures_util::stream::unfold(chunks, |mut chunks| async move {
        let chunk = chunks.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), chunks))
    });
    with_security(hyper::Response::builder().status(200))
        .header("Content-Type", "text/event-stream; charset=utf-8")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap_or_else(|_| internal_error())
}

fn with_security(mut builder: hyper::http::response::Builder) -> hyper::http::response::Builder {
    for (name, value) in SECURITY_HEADERS {
        builder = builder.header(*name, *value);
    }
    builder
}

/// What is sent should a response not build (a header value the code above made wrong).
fn internal_error() -> Answer {
    let mut answer = hyper::Response::new(Full::new(Bytes::from_static(b"internal error")).boxed());
    *answer.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_forms_are_decoded_as_a_browser_does_without_control_characters() {
        let q = pairs("channel=team%2Eops&token=ab+c&&flag", false).unwrap();
        assert_eq!(first(&q, "channel"), Some("team.ops"));
        assert_eq!(first(&q, "token"), Some("ab c"));
        assert_eq!(first(&q, "flag"), Some(""));
        // Malformed: decoded as the WHATWG URL Standard (and so a browser) reads it, not refused.
        let odd = pairs("a=%zz&b=%ff&c=100%", false).unwrap();
        assert_eq!(first(&odd, "a"), Some("%zz"));
        assert_eq!(first(&odd, "b"), Some("\u{FFFD}"));
        assert_eq!(first(&odd, "c"), Some("100%"));
        // A control character is refused, in a name too: a CR LF must never reach a header.
        for bad in ["a=%0d%0aSet-Cookie:x", "a=%00", "a%0A=x", "a=%7F"] {
            assert_eq!(pairs(bad, false), None, "{bad}");
        }
        let form = pairs("text=line+one%0D%0Aline+two%09&csrf=x", true).unwrap();
        assert_eq!(first(&form, "text"), Some("line one\r\nline two\t"));
        assert_eq!(pairs("text=%00", true), None, "only line ends and tabs");
        assert_eq!(pairs("te%0Axt=a", true), None, "not in a name");
    }

    #[test]
    fn paths_are_percent_decoded_strictly() {
        assert_eq!(
            decode_path("/spaces/m%61in/a+b").as_deref(),
            Some("/spaces/main/a+b")
        );
        assert_eq!(decode_path("/%zz").as_deref(), Some("/%zz"));
        for bad in ["/%ff", "/a%0d%0aSet-Cookie:x", "/%00"] {
            assert_eq!(decode_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn cookies_are_read_by_name() {
        let r = Request {
            method: Method::Get,
            path: "/".into(),
            query: Vec::new(),
            headers: vec![("cookie".into(), "a=1; cotald_4280=tok".into())],
            form: Vec::new(),
        };
        assert_eq!(r.cookie("cotald_4280"), Some("tok"));
        assert_eq!(r.cookie("b"), None);
    }

    #[test]
    fn addresses_are_encoded_and_read_back() {
        let url = space_url(
            "main",
            "feed",
            &[("channel", "a b&c=d/ü"), ("reply", "x+y")],
        );
        assert_eq!(
            url,
            "/spaces/main/feed?channel=a+b%26c%3Dd%2F%C3%BC&reply=x%2By"
        );
        let (path, query) = url.split_once('?').unwrap();
        assert_eq!(decode_path(path).as_deref(), Some("/spaces/main/feed"));
        let query = pairs(query, false).unwrap();
        assert_eq!(first(&query, "channel"), Some("a b&c=d/ü"));
        assert_eq!(first(&query, "reply"), Some("x+y"));
        assert_eq!(
            space_url("my-space_1", "roster", &[]),
            "/spaces/my-space_1/roster"
        );
        assert_eq!(site_url("//elsewhere.example/", &[]), "/elsewhere.example/");
        assert_eq!(site_url("/a b/?", &[("k", "v")]), "/a%20b/%3F?k=v");
    }
}
