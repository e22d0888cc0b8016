//! The registry watch: keeps the space's view of its channel registry (§7,
//! [`crate::space::registry`]) current, so that a durable join, a mention and a receipt learn
//! a channel's effective config without reading the bucket.
//!
//! The view answers only once the watch has read every key up to the present, and stops
//! answering the moment the watch ends (the bucket is then read again until a new watch has
//! caught up): a view that may be behind is never taken for the registry.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::kv::{Entry, Operation};

use super::{Context, Health, Service, ServiceError};
use crate::space::Space;
use crate::space::registry::apply;

/// Watches `space`'s channel registry into its view.
pub struct RegistryWatch {
    space: Arc<Space>,
}

impl RegistryWatch {
    /// The watch of `space`'s channel registry.
    pub fn new(space: Arc<Space>) -> Self {
        RegistryWatch { space }
    }

    async fn watch(&self, ctx: &Context) -> Result<(), ServiceError> {
        let view = self.space.registry();
        let kv = self
            .space
            .key_value(&self.space.names().channels_bucket())
            .await
            .map_err(ServiceError::at("opening the channel registry"))?;
        // The last entry of every key, then every change.
        let mut watch = kv
            .watch_all()
            .await
            .map_err(ServiceError::at("watching the channel registry"))?;
        ctx.report(Health::Running);
        // A bucket with no entry delivers nothing until its first write: asked after the
        // watch began, an empty one is caught up at once.
        let empty = kv
            .status()
            .await
            .map_err(ServiceError::at("reading the channel registry's state"))?
            .values()
            == 0;
        let mut keys = HashMap::new();
        if empty {
            view.hold(std::mem::take(&mut keys));
        }
        let mut held = empty;
        loop {
            let Some(entry) = super::next_read(ctx, &mut watch, "the registry watch").await? else {
                return Ok(());
            };
            let delta = entry.delta;
            let (key, revision, value) = seen(entry);
            if held {
                view.apply(&key, revision, value);
            } else {
                apply(&mut keys, &key, revision, value);
                if delta == 0 {
                    view.hold(std::mem::take(&mut keys));
                    held = true;
                }
            }
        }
    }
}

/// An entry as the view keeps it: a deletion or a purge has no value.
fn seen(entry: Entry) -> (String, u64, Option<bytes::Bytes>) {
    let value = (entry.operation == Operation::Put).then_some(entry.value);
    (entry.key, entry.revision, value)
}

impl Service for RegistryWatch {
    fn name(&self) -> &'static str {
        "registry"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let ended = self.watch(&ctx).await;
        self.space.registry().release();
        ended
    }
}
