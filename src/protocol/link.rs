//! Join links (§10): `cotal://[auth@]host[:port]/space[?channel=a,b]`.
//!
//! `cotals://` means TLS required. Userinfo without `:` is a token, `user:pass` is
//! username/password; both are percent-decoded. Credentials never stay in the server URL:
//! [`JoinLink::server_url`] is `nats://host:port` (or `tls://host:port` for `cotals://`, the
//! form async-nats reads as "TLS required") and [`JoinLink::auth`] is separate. The default
//! port is 4222; an explicit port is kept as written, including `:80` and `:443`. IPv6 hosts
//! are bracketed (`[::1]`).
//!
//! `channel` and `channels` are equivalent comma-separated lists (§10). If both appear, or
//! either appears more than once, the lists are concatenated in the order written, empty items
//! are dropped and repeats are removed (first occurrence wins). Commas split the raw text before
//! percent-decoding, so an encoded `%2C` stays inside one name. In query values `+` decodes to a
//! space, as in HTML forms. A fragment is ignored. Formatting writes one `channel=` parameter.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Port used when a link names none (§10).
pub const DEFAULT_PORT: u16 = 4222;

/// Why a string is not a join link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinLinkError {
    /// The scheme is not `cotal://` or `cotals://`.
    #[error("join link must start with cotal:// or cotals://")]
    UnknownScheme,
    /// No host.
    #[error("join link has no host")]
    MissingHost,
    /// The host is not a DNS name, IPv4 address or bracketed IPv6 address.
    #[error("invalid host {host:?}")]
    InvalidHost {
        /// The refused host text.
        host: String,
    },
    /// The port is not a number in 1..=65535.
    #[error("invalid port {port:?}")]
    InvalidPort {
        /// The refused port text.
        port: String,
    },
    /// No space in the path.
    #[error("join link has no space (expected /space)")]
    MissingSpace,
    /// The path has more than one segment.
    #[error("unexpected path {path:?}; a join link names exactly one space")]
    UnexpectedPath {
        /// The path after the host.
        path: String,
    },
    /// A percent-escape is malformed or decodes to invalid UTF-8.
    #[error("invalid percent-encoding in the {component}")]
    InvalidPercentEncoding {
        /// Which part of the link (`userinfo`, `space`, `query`).
        component: &'static str,
    },
    /// The token or user name is empty.
    #[error("join link credentials are empty")]
    EmptyCredential,
}

/// Credentials carried in the link's userinfo. `Debug` redacts secrets.
#[derive(Clone, PartialEq, Eq)]
pub enum LinkAuth {
    /// Bare userinfo: a token.
    Token(String),
    /// `user:pass`.
    UserPassword {
        /// User name.
        user: String,
        /// Password (may be empty).
        password: String,
    },
}

impl fmt::Debug for LinkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostKind {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

/// A validated host: a DNS name (`[A-Za-z0-9._~-]+`), an IPv4 address, or an IPv6 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host(HostKind);

impl Host {
    /// Whether the host is this machine: `localhost` or a loopback address.
    pub fn is_loopback(&self) -> bool {
        match &self.0 {
            HostKind::Name(name) => name.eq_ignore_ascii_case("localhost"),
            HostKind::V4(a) => a.is_loopback(),
            HostKind::V6(a) => a.is_loopback(),
        }
    }

    /// Parses a host as it appears in a URL; IPv6 must be bracketed (`[::1]`).
    pub fn parse(text: &str) -> Result<Self, JoinLinkError> {
        let invalid = || JoinLinkError::InvalidHost {
            host: text.to_owned(),
        };
        if text.is_empty() {
            return Err(JoinLinkError::MissingHost);
        }
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or_else(invalid)?;
            return inner
                .parse::<Ipv6Addr>()
                .map(|a| Self(HostKind::V6(a)))
                .map_err(|_| invalid());
        }
        if let Ok(v4) = text.parse::<Ipv4Addr>() {
            return Ok(Self(HostKind::V4(v4)));
        }
        let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~');
        if text.chars().all(name_char) {
            Ok(Self(HostKind::Name(text.to_owned())))
        } else {
            Err(invalid())
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            HostKind::Name(name) => f.write_str(name),
            HostKind::V4(a) => write!(f, "{a}"),
            HostKind::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// A parsed join link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinLink {
    tls: bool,
    auth: Option<LinkAuth>,
    host: Host,
    port: Option<u16>,
    space: String,
    channels: Vec<String>,
}

impl JoinLink {
    /// A link to `space` on `host` with the default port, no credentials and no channels.
    pub fn new(tls: bool, host: Host, space: impl Into<String>) -> Result<Self, JoinLinkError> {
        let space = space.into();
        if space.is_empty() {
            return Err(JoinLinkError::MissingSpace);
        }
        Ok(Self {
            tls,
            auth: None,
            host,
            port: None,
            space,
            channels: Vec::new(),
        })
    }

    /// Sets credentials; refuses an empty token or user name.
    pub fn with_auth(mut self, auth: LinkAuth) -> Result<Self, JoinLinkError> {
        let empty = match &auth {
            LinkAuth::Token(t) => t.is_empty(),
            LinkAuth::UserPassword { user, .. } => user.is_empty(),
        };
        if empty {
            return Err(JoinLinkError::EmptyCredential);
        }
        self.auth = Some(auth);
        Ok(self)
    }

    /// Sets an explicit port (kept even when it equals a scheme default).
    pub fn with_port(mut self, port: u16) -> Result<Self, JoinLinkError> {
        if port == 0 {
            return Err(JoinLinkError::InvalidPort { port: "0".into() });
        }
        self.port = Some(port);
        Ok(self)
    }

    /// Sets the channels to join; empty names and repeats are dropped.
    pub fn with_channels<I, S>(mut self, channels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.channels.clear();
        for c in channels {
            push_channel(&mut self.channels, c.into());
        }
        self
    }

    /// Whether TLS is required (`cotals://`).
    pub fn tls_required(&self) -> bool {
        self.tls
    }

    /// Credentials, to be passed as connect options, never inside the URL.
    pub fn auth(&self) -> Option<&LinkAuth> {
        self.auth.as_ref()
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port as written, if any.
    pub fn explicit_port(&self) -> Option<u16> {
        self.port
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PORT)
    }

    /// The space name (percent-decoded).
    pub fn space(&self) -> &str {
        &self.space
    }

    /// Channels to join on connect, as written (not yet sanitized into [`super::Channel`]s).
    pub fn channels(&self) -> &[String] {
        &self.channels
    }

    /// `nats://host:port`, or `tls://host:port` when TLS is required. Never holds credentials.
    pub fn server_url(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        format!("{scheme}://{}:{}", self.host, self.port())
    }

    /// Parses a join link.
    pub fn parse(link: &str) -> Result<Self, JoinLinkError> {
        let (scheme, rest) = link.split_once("://").ok_or(JoinLinkError::UnknownScheme)?;
        let tls = if scheme.eq_ignore_ascii_case("cotal") {
            false
        } else if scheme.eq_ignore_ascii_case("cotals") {
            true
        } else {
            return Err(JoinLinkError::UnknownScheme);
        };
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };

        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let auth = userinfo.map(parse_userinfo).transpose()?;
        let (host, port) = split_host_port(hostport)?;
        let host = Host::parse(host)?;
        let port = port.map(parse_port).transpose()?;

        let space_raw = path.strip_prefix('/').unwrap_or(path);
        if space_raw.contains('/') {
            return Err(JoinLinkError::UnexpectedPath {
                path: path.to_owned(),
            });
        }
        let space = percent_decode(space_raw, false, "space")?;
        if space.is_empty() {
            return Err(JoinLinkError::MissingSpace);
        }

        let mut channels = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key, true, "query")?;
            if key == "channel" || key == "channels" {
                for item in value.split(',') {
                    push_channel(&mut channels, percent_decode(item, true, "query")?);
                }
            }
        }

        Ok(Self {
            tls,
            auth,
            host,
            port,
            space,
            channels,
        })
    }
}

fn push_channel(channels: &mut Vec<String>, channel: String) {
    if !channel.is_empty() && !channels.contains(&channel) {
        channels.push(channel);
    }
}

fn parse_userinfo(userinfo: &str) -> Result<LinkAuth, JoinLinkError> {
    let auth = match userinfo.split_once(':') {
        None => LinkAuth::Token(percent_decode(userinfo, false, "userinfo")?),
        Some((user, password)) => LinkAuth::UserPassword {
            user: percent_decode(user, false, "userinfo")?,
            password: percent_decode(password, false, "userinfo")?,
        },
    };
    match &auth {
        LinkAuth::Token(t) if t.is_empty() => Err(JoinLinkError::EmptyCredential),
        LinkAuth::UserPassword { user, .. } if user.is_empty() => {
            Err(JoinLinkError::EmptyCredential)
        }
        _ => Ok(auth),
    }
}

fn split_host_port(hostport: &str) -> Result<(&str, Option<&str>), JoinLinkError> {
    if hostport.starts_with('[') {
        let end = hostport
            .find(']')
            .ok_or_else(|| JoinLinkError::InvalidHost {
                host: hostport.to_owned(),
            })?;
        let (host, after) = hostport.split_at(end + 1);
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(JoinLinkError::InvalidHost {
                    host: hostport.to_owned(),
                }),
            },
        };
    }
    Ok(match hostport.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (hostport, None),
    })
}

fn parse_port(text: &str) -> Result<u16, JoinLinkError> {
    let invalid = || JoinLinkError::InvalidPort {
        port: text.to_owned(),
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid()),
        Ok(port) => Ok(port),
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn percent_decode(
    text: &str,
    plus_is_space: bool,
    component: &'static str,
) -> Result<String, JoinLinkError> {
    let invalid = || JoinLinkError::InvalidPercentEncoding { component };
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = bytes.get(i + 1).copied().and_then(hex_value);
                let lo = bytes.get(i + 2).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(invalid());
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| invalid())
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str, out: &mut fmt::Formatter<'_>) -> fmt::Result {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            write!(out, "{}", b as char)?;
        } else {
            write!(out, "%{b:02X}")?;
        }
    }
    Ok(())
}

impl fmt::Display for JoinLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "cotals://" } else { "cotal://" })?;
        match &self.auth {
            None => {}
            Some(LinkAuth::Token(token)) => {
                percent_encode(token, f)?;
                f.write_str("@")?;
            }
            Some(LinkAuth::UserPassword { user, password }) => {
                percent_encode(user, f)?;
                f.write_str(":")?;
                percent_encode(password, f)?;
                f.write_str("@")?;
            }
        }
        write!(f, "{}", self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        f.write_str("/")?;
        percent_encode(&self.space, f)?;
        for (i, channel) in self.channels.iter().enumerate() {
            f.write_str(if i == 0 { "?channel=" } else { "," })?;
            percent_encode(channel, f)?;
        }
        Ok(())
    }
}

impl FromStr for JoinLink {
    type Err = JoinLinkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> JoinLink {
        JoinLink::parse(s).unwrap()
    }

    #[test]
    fn plain_link_uses_default_port() {
        let l = parse("cotal://localhost/main");
        assert!(!l.tls_required());
        assert_eq!(l.port(), 4222);
        assert_eq!(l.explicit_port(), None);
        assert_eq!(l.space(), "main");
        assert_eq!(l.server_url(), "nats://localhost:4222");
        assert!(l.auth().is_none());
        assert!(l.channels().is_empty());
    }

    #[test]
    fn tls_link_maps_to_tls_url() {
        let l = parse("cotals://nats.example.com:7422/main");
        assert!(l.tls_required());
        assert_eq!(l.server_url(), "tls://nats.example.com:7422");
    }

    #[test]
    fn explicit_default_http_ports_are_kept() {
        assert_eq!(parse("cotal://h:80/s").server_url(), "nats://h:80");
        assert_eq!(parse("cotals://h:443/s").server_url(), "tls://h:443");
        assert_eq!(parse("cotal://h:4222/s").explicit_port(), Some(4222));
        assert_eq!(parse("cotal://h:4222/s").to_string(), "cotal://h:4222/s");
    }

    #[test]
    fn token_and_user_password_are_split_out_and_decoded() {
        let l = parse("cotal://s3cr%40t@h/main");
        assert_eq!(l.auth(), Some(&LinkAuth::Token("s3cr@t".into())));
        assert_eq!(l.server_url(), "nats://h:4222");
        let l = parse("cotal://al%20ice:p%3Ass@w@h:1/main");
        assert_eq!(
            l.auth(),
            Some(&LinkAuth::UserPassword {
                user: "al ice".into(),
                password: "p:ss@w".into()
            })
        );
        assert!(!l.server_url().contains('@'));
        let l = parse("cotal://bob:@h/main");
        assert_eq!(
            l.auth(),
            Some(&LinkAuth::UserPassword {
                user: "bob".into(),
                password: String::new()
            })
        );
    }

    #[test]
    fn debug_redacts_secrets() {
        let l = parse("cotal://user:hunter2@h/main");
        let shown = format!("{l:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user"));
        let shown = format!("{:?}", parse("cotal://tok123@h/main"));
        assert!(!shown.contains("tok123"), "{shown}");
    }

    #[test]
    fn ipv6_hosts() {
        let l = parse("cotal://[::1]:4223/main");
        assert_eq!(l.server_url(), "nats://[::1]:4223");
        assert_eq!(
            parse("cotals://[2001:db8::1]/m").server_url(),
            "tls://[2001:db8::1]:4222"
        );
        assert_eq!(l.to_string(), "cotal://[::1]:4223/main");
        assert_eq!(
            parse("cotal://10.0.0.1/m").server_url(),
            "nats://10.0.0.1:4222"
        );
    }

    #[test]
    fn channel_and_channels_are_merged() {
        assert_eq!(parse("cotal://h/s?channel=a,b").channels(), ["a", "b"]);
        assert_eq!(parse("cotal://h/s?channels=a,b").channels(), ["a", "b"]);
        assert_eq!(
            parse("cotal://h/s?channel=a,b&channels=b,c&channel=d").channels(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(
            parse("cotal://h/s?x=1&channel=,team.backend,&y").channels(),
            ["team.backend"]
        );
        assert_eq!(
            parse("cotal://h/s?channel=a%2Cb,c+d").channels(),
            ["a,b", "c d"]
        );
        assert_eq!(parse("cotal://h/s?channel=a#frag").channels(), ["a"]);
    }

    #[test]
    fn space_is_percent_decoded() {
        assert_eq!(parse("cotal://h/my%20space").space(), "my space");
        assert_eq!(parse("cotal://h/a+b").space(), "a+b");
        assert_eq!(parse("COTAL://h/main").space(), "main");
    }

    #[test]
    fn refusals_are_typed() {
        use JoinLinkError as E;
        let cases = [
            ("nats://h/s", E::UnknownScheme),
            ("cotal:/h/s", E::UnknownScheme),
            ("http://h/s", E::UnknownScheme),
            ("cotal:///s", E::MissingHost),
            ("cotal://tok@/s", E::MissingHost),
            ("cotal://h", E::MissingSpace),
            ("cotal://h/", E::MissingSpace),
            ("cotal://h/?channel=a", E::MissingSpace),
            (
                "cotal://h/a/b",
                E::UnexpectedPath {
                    path: "/a/b".into(),
                },
            ),
            ("cotal://h:/s", E::InvalidPort { port: "".into() }),
            ("cotal://h:0/s", E::InvalidPort { port: "0".into() }),
            (
                "cotal://h:65536/s",
                E::InvalidPort {
                    port: "65536".into(),
                },
            ),
            ("cotal://h:+1/s", E::InvalidPort { port: "+1".into() }),
            ("cotal://h:1:2/s", E::InvalidPort { port: "1:2".into() }),
            (
                "cotal://h%20x/s",
                E::InvalidHost {
                    host: "h%20x".into(),
                },
            ),
            (
                "cotal://[::1/s",
                E::InvalidHost {
                    host: "[::1".into(),
                },
            ),
            (
                "cotal://[zz]/s",
                E::InvalidHost {
                    host: "[zz]".into(),
                },
            ),
            (
                "cotal://[::1]x/s",
                E::InvalidHost {
                    host: "[::1]x".into(),
                },
            ),
            ("cotal://@h/s", E::EmptyCredential),
            ("cotal://:pw@h/s", E::EmptyCredential),
            (
                "cotal://h/%zz",
                E::InvalidPercentEncoding { component: "space" },
            ),
            (
                "cotal://h/%ff",
                E::InvalidPercentEncoding { component: "space" },
            ),
            (
                "cotal://a%2@h/s",
                E::InvalidPercentEncoding {
                    component: "userinfo",
                },
            ),
            (
                "cotal://h/s?channel=%",
                E::InvalidPercentEncoding { component: "query" },
            ),
        ];
        for (link, expected) in cases {
            assert_eq!(JoinLink::parse(link), Err(expected), "{link}");
        }
    }

    #[test]
    fn builder_refusals() {
        let host = Host::parse("h").unwrap();
        assert_eq!(
            JoinLink::new(false, host.clone(), ""),
            Err(JoinLinkError::MissingSpace)
        );
        let link = JoinLink::new(false, host, "s").unwrap();
        assert_eq!(
            link.clone().with_port(0),
            Err(JoinLinkError::InvalidPort { port: "0".into() })
        );
        assert_eq!(
            link.clone().with_auth(LinkAuth::Token(String::new())),
            Err(JoinLinkError::EmptyCredential)
        );
        assert_eq!(
            link.with_auth(LinkAuth::UserPassword {
                user: String::new(),
                password: "x".into()
            }),
            Err(JoinLinkError::EmptyCredential)
        );
    }

    #[test]
    fn formatting_round_trips() {
        let link = JoinLink::new(true, Host::parse("[::1]").unwrap(), "my space/é")
            .unwrap()
            .with_port(443)
            .unwrap()
            .with_auth(LinkAuth::UserPassword {
                user: "a:b".into(),
                password: "p@ss w,rd".into(),
            })
            .unwrap()
            .with_channels(["team.backend", "a,b", "x>"]);
        let text = link.to_string();
        assert_eq!(
            text,
            "cotals://a%3Ab:p%40ss%20w%2Crd@[::1]:443/my%20space%2F%C3%A9?channel=team.backend,a%2Cb,x%3E"
        );
        assert_eq!(text.parse::<JoinLink>().unwrap(), link);
    }
}
