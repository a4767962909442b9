//! A local OTLP/gRPC trace collector: every span received, with its service's name (what a few
//! lines of Python would do, in-process).

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value as AnyValue,
    trace::v1::Span,
};

/// Every span received, with its service's name.
#[derive(Clone, Default)]
pub struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

impl Collector {
    /// Listens on 127.0.0.1; the collector and its port.
    pub async fn start() -> (Self, u16) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serving = collector.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(serving))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        (collector, port)
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    AnyValue::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A span's attribute as text.
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => s.clone(),
            AnyValue::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

/// An ID as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
