//! Where a request goes: the kind, namespace and name from the path, then the verb from the
//! method (k8s.io/apiserver's `endpoints/installer`).

use std::{borrow::Cow, sync::Arc};

use axum::{
    extract::Request,
    http::{HeaderMap, Method},
    response::{IntoResponse, Response},
};

use super::dispatch::Endpoint;
use super::response::ItemResponse;
use super::strategy::Subresource;
use super::{
    context::RestContext,
    kind_api::{KindApi, KindApiInner},
};
use crate::{
    error::{Error, Result},
    request_info::RequestInfo,
    resource::{ResourceInfo, ServedResource},
    store::{Store, StoreStats},
};

/// The resource endpoints of every served kind, found from the request path the way
/// kube-apiserver's installer lays them out under `/apis/<group>/<version>/`: for a namespaced
/// kind `<plural>` (all namespaces), `namespaces/<namespace>/<plural>` and
/// `namespaces/<namespace>/<plural>/<name>`; for a cluster-scoped kind `<plural>` and
/// `<plural>/<name>`. Anything else (discovery, subresources, unknown kinds) is not a resource
/// endpoint and goes to the router.
///
/// These are the hot paths, so they are matched here rather than as axum routes with path
/// parameters (see PERFORMANCE.md).
pub struct Endpoints {
    /// The API group, the first segment after `/apis/`.
    group: &'static str,
    kinds: Vec<RoutedKind>,
    /// The versions served: a path's version is matched against these, and a kind's is its
    /// index here (no text compared per kind).
    versions: Vec<&'static str>,
}

struct RoutedKind {
    /// The version it is served at (a kind may be served at several).
    version: &'static str,
    /// Its index in [`Endpoints::versions`].
    version_index: usize,
    /// Whether this is the version its store holds (the one counted in metrics).
    stored: bool,
    plural: &'static str,
    namespaced: bool,
    /// `<object>/status` is served.
    status: bool,
    endpoint: Arc<dyn Endpoint>,
}

/// A request's place among the resource endpoints (segments as sent, not yet decoded). A
/// cluster-scoped kind's objects are in the namespace "".
pub struct Target<'a> {
    endpoint: &'a Arc<dyn Endpoint>,
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    /// The object or, for `<object>/status`, its status.
    part: Subresource,
}

impl Endpoints {
    /// No kinds yet, in the API group `group`.
    pub fn new(group: &'static str) -> Self {
        Self {
            group,
            kinds: Vec::new(),
            versions: Vec::new(),
        }
    }

    /// Serves `K` from `store`. Fails when the kind's schema does not convert for field
    /// management (server-side apply), naming the kind: at start-up rather than at its first
    /// write.
    /// `info` is what the kind's registration says of it (its version and the one it is stored
    /// at); `versions`, its versions for field management and admission when it has several.
    pub fn with<K: ServedResource>(
        mut self,
        store: Arc<dyn Store<K>>,
        info: ResourceInfo,
        versions: Option<Arc<dyn super::field_managers::Versions>>,
        ctx: RestContext,
    ) -> anyhow::Result<Self> {
        let managed = versions
            .clone()
            .map(|v| -> Arc<dyn fieldmanager::Versions> { v });
        let fields = super::field_managers::FieldManagers::of(&info, managed).map_err(|e| {
            anyhow::anyhow!(
                "kind {} ({}.{}): its schema does not convert for field management: {e}",
                info.kind,
                info.plural,
                info.group
            )
        })?;
        let equivalents = versions.map(|v| -> Arc<dyn crate::admission::Equivalents> { v });
        let endpoint: Arc<dyn Endpoint> = Arc::new(KindApi::<K>::new(KindApiInner {
            store,
            ctx,
            fields,
            equivalents,
        }));
        let version_index = match self.versions.iter().position(|v| *v == info.version) {
            Some(index) => index,
            None => {
                self.versions.push(info.version);
                self.versions.len() - 1
            }
        };
        self.kinds.push(RoutedKind {
            version: info.version,
            version_index,
            stored: info.version == info.storage_version,
            plural: info.plural,
            namespaced: info.namespaced,
            status: info.status,
            endpoint,
        });
        Ok(self)
    }

    /// The resource endpoint `path` names, or None when it is not one (the router answers).
    /// Only matches: whether the method is served is decided by the call.
    pub fn find<'a>(&'a self, path: &'a str) -> Option<Target<'a>> {
        let rest = path
            .strip_prefix("/apis/")?
            .strip_prefix(self.group)?
            .strip_prefix('/')?;
        let (version, rest) = self.versions.iter().enumerate().find_map(|(index, v)| {
            let rest = rest.strip_prefix(v)?.strip_prefix('/')?;
            Some((index, rest))
        })?;
        let mut segments = crate::request_info::segments(rest);
        let first = segments.next()?;
        let kind = |plural: &str| {
            self.kinds
                .iter()
                .find(|k| k.version_index == version && k.plural == plural)
        };
        let (kind, namespace, name) = if first == "namespaces" {
            let namespace = segments.next()?;
            let kind = kind(segments.next()?).filter(|k| k.namespaced)?;
            (kind, Some(namespace), segments.next())
        } else {
            let kind = kind(first)?;
            let name = segments.next();
            match kind.namespaced {
                // A namespaced kind has no items outside a namespace.
                true if name.is_some() => return None,
                true => (kind, None, None),
                false => (kind, Some(""), name),
            }
        };
        // The status subresource, when the kind has one; no other.
        let part = match segments.next() {
            None => Subresource::Object,
            Some("status") if kind.status && name.is_some() => Subresource::Status,
            Some(_) => return None,
        };
        if segments.next().is_some()
            || (kind.namespaced && namespace == Some(""))
            || name == Some("")
        {
            return None;
        }
        Some(Target {
            endpoint: &kind.endpoint,
            group: self.group,
            version: kind.version,
            plural: kind.plural,
            namespace,
            name,
            part,
        })
    }

    /// Each kind's qualified resource (`zebras.zoo.example.com`) and its store's figures, as
    /// held now: a scrape never waits on etcd.
    pub fn stored_objects(&self) -> Vec<(String, StoreStats)> {
        let mut counts = Vec::with_capacity(self.kinds.len());
        for kind in self.kinds.iter().filter(|k| k.stored) {
            if let Some(stats) = kind.endpoint.stats_sync() {
                counts.push((format!("{}.{}", kind.plural, self.group), stats));
            }
        }
        counts
    }
}

/// A request's resource endpoint with its path segments decoded, owned: what the edge hands
/// from the path that answers at once to the one that waits.
pub struct Route {
    endpoint: Arc<dyn Endpoint>,
    part: Subresource,
    /// Namespace and name as the client meant them, or why the path cannot be decoded.
    segments: Result<(Option<String>, Option<String>)>,
}

impl Route {
    /// Serves the request.
    pub async fn call(self, request: Request) -> Response {
        match self.segments {
            Ok((namespace, name)) => {
                self.endpoint
                    .call(namespace, name, self.part, request)
                    .await
            }
            Err(error) => error.into_response(),
        }
    }
}

impl<'a> Target<'a> {
    /// What authorization, metrics and the log see of a request to this target at `path` (the
    /// path it was found in): [`RequestInfo::parse`]'s answer, built from the parts routing
    /// found, so that what is authorized is what is served.
    pub fn request_info(
        &self,
        method: &Method,
        path: &'a str,
        query: Option<&str>,
    ) -> RequestInfo<'a> {
        RequestInfo::of_resource(
            method,
            path,
            query,
            self.group,
            self.version,
            self.namespace.unwrap_or(""),
            self.plural,
            self.name.unwrap_or(""),
            match self.part {
                Subresource::Object => "",
                Subresource::Status => "status",
            },
        )
    }

    /// The owned [`Route`] of this target.
    pub fn route(&self) -> Route {
        let segments = match (
            self.namespace
                .map(|s| path_segment(s).map(Cow::into_owned))
                .transpose(),
            self.name
                .map(|s| path_segment(s).map(Cow::into_owned))
                .transpose(),
        ) {
            (Ok(namespace), Ok(name)) => Ok((namespace, name)),
            (Err(error), _) | (_, Err(error)) => Err(error),
        };
        Route {
            endpoint: self.endpoint.clone(),
            part: self.part,
            segments,
        }
    }

    /// The response to a GET of one object, without the general path ([`ItemResponse`]); None
    /// when it has to go through [`Route::call`].
    pub fn call_sync(
        &self,
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<ItemResponse> {
        let (Some(namespace), Some(name)) = (self.namespace, self.name) else {
            return None;
        };
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        match (path_segment(namespace), path_segment(name)) {
            (Ok(namespace), Ok(name)) => self
                .endpoint
                .get_response_sync(&namespace, &name, query, headers),
            (Err(error), _) | (_, Err(error)) => Some(ItemResponse::Ready(error.into_response())),
        }
    }
}

/// A path segment as the client meant it (percent-decoded, as Go's net/url gives
/// kube-apiserver its paths).
pub(crate) fn path_segment(raw: &str) -> Result<Cow<'_, str>> {
    // Most segments have no escape: they are the text as it is (already UTF-8).
    if !raw.as_bytes().contains(&b'%') {
        return Ok(Cow::Borrowed(raw));
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| Error::BadRequest(format!("invalid path segment {raw:?}: not UTF-8")))
}
