//! A client that speaks the NATS protocol byte by byte over TLS: it writes frames no library
//! would (a header block with a bare CR, bytes that are not UTF-8, a line with no colon, a bad
//! status line), as an agent holding a credential can. What the broker passes through reaches
//! every reader of the subject untouched.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

use super::helper::TIMEOUT;

/// A connected raw client.
pub(crate) struct RawClient {
    stream: BufReader<TlsStream<TcpStream>>,
    /// The instance id of the credential.
    pub(crate) id: String,
    next_reply: u64,
}

/// A frame the raw client read.
#[derive(Debug)]
pub(crate) enum Frame {
    /// `MSG`/`HMSG`: the whole payload (header block included).
    Msg { payload: Vec<u8> },
    /// `-ERR '…'`.
    Err(String),
}

impl RawClient {
    /// Connects to `addr` with the `.creds` at `creds`, trusting `ca`, and completes the
    /// handshake (CONNECT, then a PING answered by a PONG).
    pub(crate) async fn connect(addr: &str, creds: &Path, ca: &Path) -> RawClient {
        let text = std::fs::read_to_string(creds).unwrap();
        let creds = cotald::binding::Creds::parse(&text).unwrap();
        let id = creds.public_key().unwrap();
        let mut tcp = BufReader::new(TcpStream::connect(addr).await.unwrap());
        // The server speaks first, in the clear: INFO with the nonce to sign.
        let mut info = String::new();
        tcp.read_line(&mut info).await.unwrap();
        let info: serde_json::Value =
            serde_json::from_str(info.trim_start_matches("INFO ").trim()).unwrap();
        let nonce = info["nonce"].as_str().expect("a nonce").to_owned();
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp.into_inner())
            .await
            .unwrap();
        let key = nkeys::KeyPair::from_seed(&creds.seed).unwrap();
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(key.sign(nonce.as_bytes()).unwrap());
        let connect = serde_json::json!({
            "verbose": false, "pedantic": false, "tls_required": true, "headers": true,
            "no_responders": true, "protocol": 1, "lang": "raw", "version": "0",
            "name": "raw-frames", "jwt": creds.jwt, "sig": sig,
        });
        let mut raw = RawClient {
            stream: BufReader::new(tls),
            id,
            next_reply: 0,
        };
        raw.write(format!("CONNECT {connect}\r\nPING\r\n").as_bytes())
            .await;
        loop {
            let line = raw.line().await;
            match line.as_str() {
                "PONG" => break,
                l if l.starts_with("-ERR") => panic!("the broker refused the raw client: {l}"),
                _ => {}
            }
        }
        raw
    }

    async fn write(&mut self, bytes: &[u8]) {
        let stream = self.stream.get_mut();
        stream.write_all(bytes).await.unwrap();
        stream.flush().await.unwrap();
    }

    async fn line(&mut self) -> String {
        let mut line = Vec::new();
        tokio::time::timeout(TIMEOUT, self.stream.read_until(b'\n', &mut line))
            .await
            .expect("the broker answers in time")
            .unwrap();
        String::from_utf8_lossy(&line).trim_end().to_owned()
    }

    /// Publishes `header` (the whole header block, as written) and `body` on `subject`, with a
    /// reply subject in the identity's own inbox, and returns what the broker (JetStream)
    /// answered there.
    pub(crate) async fn hpub(&mut self, subject: &str, header: &[u8], body: &[u8]) -> String {
        self.next_reply += 1;
        let reply = format!("_INBOX_{}.raw.{}", self.id, self.next_reply);
        if self.next_reply == 1 {
            self.write(format!("SUB _INBOX_{}.raw.* 1\r\n", self.id).as_bytes())
                .await;
        }
        let mut frame = format!(
            "HPUB {subject} {reply} {} {}\r\n",
            header.len(),
            header.len() + body.len()
        )
        .into_bytes();
        frame.extend_from_slice(header);
        frame.extend_from_slice(body);
        frame.extend_from_slice(b"\r\n");
        self.write(&frame).await;
        match self.frame().await {
            Frame::Msg { payload, .. } => String::from_utf8_lossy(&payload).into_owned(),
            Frame::Err(e) => panic!("the broker refused the publish on {subject}: {e}"),
        }
    }

    /// The next `MSG`, `HMSG` or `-ERR` (PINGs are answered on the way).
    pub(crate) async fn frame(&mut self) -> Frame {
        loop {
            let line = self.line().await;
            let mut words = line.split_whitespace();
            match words.next() {
                Some("PING") => self.write(b"PONG\r\n").await,
                Some("-ERR") => return Frame::Err(line),
                Some("MSG" | "HMSG") => {
                    let total: usize = words.next_back().unwrap().parse().unwrap();
                    let mut payload = vec![0; total + 2];
                    self.stream.read_exact(&mut payload).await.unwrap();
                    payload.truncate(total);
                    return Frame::Msg { payload };
                }
                _ => {}
            }
        }
    }
}
