//! The steps of every write, once. A verb makes the object it wants stored (its transform: a
//! POST decodes it, a PUT replaces, a patch patches, an apply applies); [`Writing::commit`]
//! then takes that object through the kind's strategy, its managed fields, admission and the
//! store, as k8s.io/apiserver's generic store does for every verb (`BeforeCreate` or
//! `BeforeUpdate`, the field manager, admission, storage). Verbs that start from the stored
//! object run their transform and `commit` inside [`guaranteed::retry`].

use std::sync::Arc;

use super::guaranteed::{self, Failed};
use super::strategy::{Subresource, prepare_create, prepare_update, written_part};
use super::{admit, kind_api::KindApi};
use crate::{
    admission::{Attributes, Operation},
    auth::UserInfo,
    error::Result,
    resource::ServedResource,
    store::{Object, UpdateFrom, WritableStore},
};

/// Who writes, and how: what a write's admission attributes are made of.
pub(crate) struct Author {
    pub(crate) user: Option<Arc<UserInfo>>,
    pub(crate) dry_run: bool,
    /// The field manager: the request's `fieldManager`, else its user agent's.
    pub(crate) manager: String,
}

/// What the object a verb made replaces.
pub(crate) enum Replacing<'a, K> {
    /// Nothing: a create. `renamed`: whether admission may rename it (a POST with
    /// `generateName` may be renamed; an apply names its object in the URL).
    Nothing { renamed: bool },
    /// The stored object, as this attempt read it `from` the cache or the source.
    Stored {
        current: &'a Object<K>,
        from: UpdateFrom,
    },
}

/// Who sets the managed fields of the object a verb made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManagedFields {
    /// The pipeline, for the author's manager (create, update, patch).
    Updated,
    /// The verb: an apply's field manager merged them with the applied configuration.
    Applied,
}

/// One write by an author, of a `K`, to one part of an object in one namespace.
pub(crate) struct Writing<'a, K> {
    pub(crate) api: &'a KindApi<K>,
    pub(crate) writer: &'a dyn WritableStore<K>,
    pub(crate) author: &'a Author,
    /// The URL's namespace ("" for a cluster-scoped kind).
    pub(crate) namespace: &'a str,
    pub(crate) part: Subresource,
}

impl<K: ServedResource> Writing<'_, K> {
    /// Stores `object`, made by a verb, in place of what it is `replacing`:
    /// 1. for an update, the resourceVersion it names compared with the stored one (409 when
    ///    stale); then the kind's strategy (the part written kept, server-set fields set or
    ///    kept, then NamespaceLifecycle for a create);
    /// 2. the managed fields, before admission as in kube-apiserver (what webhooks add is
    ///    nobody's), unless the verb applied them;
    /// 3. admission (mutating, then validating), its warnings added to `warnings`;
    /// 4. the store: a create, or [`guaranteed::write`] in place of the object read.
    pub(crate) async fn commit(
        &self,
        mut object: K,
        replacing: Replacing<'_, K>,
        fields: ManagedFields,
        warnings: &mut Vec<String>,
    ) -> std::result::Result<Object<K>, Failed> {
        let (api, author, part) = (self.api, self.author, self.part);
        let current = match replacing {
            Replacing::Nothing { .. } => {
                prepare_create(&mut object, self.namespace)?;
                namespace_lifecycle(api, &object).await?;
                None
            }
            Replacing::Stored { current, .. } => {
                // The resourceVersion the write names first, as kube-apiserver's Update checks
                // it before the strategy and admission: a stale one is a 409, whatever else.
                if object.meta().resource_version != current.meta().resource_version {
                    return Err(guaranteed::stale(current));
                }
                let applied = (fields == ManagedFields::Applied)
                    .then(|| object.meta().managed_fields.clone());
                object = written_part(object, current.as_ref(), part);
                if let Some(managed) = applied {
                    // The apply's entries, /status's own included.
                    object.meta_mut().managed_fields = managed;
                }
                prepare_update(&mut object, current.as_ref(), part)?;
                Some(current)
            }
        };
        if fields == ManagedFields::Updated {
            let current = current.map(|current| &**current);
            api.fields
                .update(part, current, &mut object, &author.manager)?;
        }
        let name = object.meta().name.clone().unwrap_or_default();
        match replacing {
            Replacing::Nothing { renamed } => {
                let attributes = self.attributes(Operation::Create, &name);
                admit::admit_create(api, attributes, &mut object, renamed, warnings).await?;
                self.writer
                    .create(object, author.dry_run)
                    .await
                    .map_err(Failed::of_store)
            }
            Replacing::Stored { current, from } => {
                let attributes = self.attributes(Operation::Update, &name);
                let stored = current.as_ref();
                admit::admit_update(api, &attributes, &mut object, stored, part, warnings).await?;
                guaranteed::write(self.writer, object, current, from, author.dry_run).await
            }
        }
    }

    /// The admission attributes of this write, as an `operation` on the object `name`.
    fn attributes<'n>(&'n self, operation: Operation, name: &'n str) -> Attributes<'n> {
        let author = self.author;
        let mut attributes = admit::attributes::<K>(
            operation,
            self.part,
            self.namespace,
            name,
            author.user.as_deref(),
            author.dry_run,
            admit::write_options(author.dry_run, &author.manager),
        );
        attributes.equivalents = self.api.equivalents.clone();
        attributes
    }
}

/// NamespaceLifecycle admission of a create, when the server has a cluster's namespaces.
async fn namespace_lifecycle<K: ServedResource>(api: &KindApi<K>, object: &K) -> Result<()> {
    let (Some(namespaces), true) = (&api.ctx.namespaces, K::namespaced()) else {
        return Ok(());
    };
    let meta = object.meta();
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(meta.generate_name.as_deref())
        .unwrap_or("Unknown");
    namespaces
        .admit_create(meta.namespace.as_deref().unwrap_or(""), K::subject(name))
        .await
}
