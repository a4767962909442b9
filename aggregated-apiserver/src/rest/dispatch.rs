//! The verb dispatch of one kind: what a routed request ([`super::route`] found its kind,
//! namespace, name and part) becomes, by method and by what the kind's store allows: get,
//! list and watch from any store; create, update, patch, delete and deletecollection from a
//! writable one; 405 otherwise, in kube-apiserver's words.

use axum::{
    extract::Request,
    http::{HeaderMap, Method},
    response::{IntoResponse, Response},
};

use super::delete::{delete, delete_collection};
use super::kind_api::KindApi;
use super::read::{get_item, get_item_sync, list_all, list_namespaced};
use super::response::ItemResponse;
use super::strategy::Subresource;
use super::write::{create, patch, update};
use crate::{error::Error, resource::ServedResource, store::StoreStats};

/// One kind's REST verbs behind a path.
pub(crate) trait Endpoint: Send + Sync {
    fn call(
        &self,
        namespace: Option<String>,
        name: Option<String>,
        part: Subresource,
        request: Request,
    ) -> futures::future::BoxFuture<'static, Response>;

    /// A GET of one object answered without the general path: at once when the store holds
    /// it in memory, else from the store's own read; None when only [`Endpoint::call`] can
    /// answer (a watch).
    fn get_response_sync(
        &self,
        namespace: &str,
        name: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<ItemResponse>;

    /// The store's figures as it holds them now, for `apiserver_storage_objects`
    /// ([`Store::stats_sync`]).
    fn stats_sync(&self) -> Option<StoreStats>;
}

impl<K: ServedResource> Endpoint for KindApi<K> {
    fn call(
        &self,
        namespace: Option<String>,
        name: Option<String>,
        part: Subresource,
        request: Request,
    ) -> futures::future::BoxFuture<'static, Response> {
        Box::pin(self.clone().serve(namespace, name, part, request))
    }

    fn get_response_sync(
        &self,
        namespace: &str,
        name: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<ItemResponse> {
        get_item_sync(self, namespace, name, query, headers)
    }

    fn stats_sync(&self) -> Option<StoreStats> {
        self.store.stats_sync()
    }
}

impl<K: ServedResource> KindApi<K> {
    async fn serve(
        self,
        namespace: Option<String>,
        name: Option<String>,
        part: Subresource,
        request: Request,
    ) -> Response {
        let method = request.method().clone();
        let read = method == Method::GET || method == Method::HEAD;
        let writable = self.store.writable().is_some();
        if part == Subresource::Status {
            // `<object>/status`: get, update and patch (of the status alone).
            let (Some(namespace), Some(name)) = (namespace, name) else {
                return Error::NoRoute.into_response();
            };
            let result = match method {
                _ if read => get_item(self, namespace, name, request).await,
                Method::PUT if writable => {
                    Box::pin(update(self, namespace, name, part, request)).await
                }
                Method::PATCH if writable => {
                    Box::pin(patch(self, namespace, name, part, request)).await
                }
                _ => Err(method_not_allowed::<K>(&method, None)),
            };
            return result.into_response();
        }
        let result = match (namespace, name) {
            (None, _) if read => list_all(self, request).await,
            (Some(namespace), None) if read => list_namespaced(self, namespace, request).await,
            (Some(namespace), Some(name)) if read => get_item(self, namespace, name, request).await,
            // Writes are boxed: their futures (body reads, patches) are the largest, and would
            // otherwise size (and be copied with) every read's future too.
            (Some(namespace), None) if writable && method == Method::POST => {
                Box::pin(create(self, namespace, request)).await
            }
            (Some(namespace), None) if writable && method == Method::DELETE => {
                Box::pin(delete_collection(self, namespace, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::PUT => {
                Box::pin(update(self, namespace, name, part, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::PATCH => {
                Box::pin(patch(self, namespace, name, part, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::DELETE => {
                Box::pin(delete(self, namespace, name, request)).await
            }
            _ => Err(method_not_allowed::<K>(&method, request.uri().query())),
        };
        result.into_response()
    }
}

pub(crate) fn method_not_allowed<K: ServedResource>(method: &Method, query: Option<&str>) -> Error {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::GET if query.is_some_and(|q| q.contains("watch=")) => "watch",
        _ => method.as_str(),
    };
    Error::MethodNotAllowed(format!(
        "{} is not supported on resources of kind {:?}",
        verb.to_ascii_lowercase(),
        K::qualified_resource()
    ))
}
