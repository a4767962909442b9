//! Which protocol a connection is served in: the one its TLS handshake's ALPN chose, as Go's
//! server decides; without ALPN, whichever the first bytes show (HTTP/2 with prior knowledge, or
//! HTTP/1.1).

use crate::common::{Alpn, TestServer};

#[tokio::test]
async fn each_protocol_is_served_with_alpn_and_without() {
    let server = TestServer::start().await;
    for alpn in [Alpn::Http1, Alpn::Http2] {
        let offered = server.raw(Some(server.admin_identity()), alpn);
        for raw in [offered.clone(), offered.without_alpn()] {
            let reply = raw
                .get("/apis/farm.example.com/v1/namespaces/default/llamas", &[])
                .await;
            assert_eq!(reply.status, 200, "{alpn:?}");
            assert_eq!(reply.json()["kind"], "LlamaList", "{alpn:?}");
        }
    }
}
