//! The channels of a space as an endpoint can see them (§7): every channel the registry
//! configures or the CHAT stream holds messages of, with its stored config, its effective
//! config (the one resolution of §7), how many messages CHAT keeps of it and when the last
//! was stored.
//!
//! The registry is read like a join reads it: an unreadable registry is an error, never a
//! guess (§12 item 11). The counts come from the CHAT stream's per-subject state, which a
//! credential may not be granted; then they are `None` and the rest is still reported.

use std::collections::BTreeMap;

use futures_util::StreamExt;

use super::{Client, ClientError, nats_err};
use crate::protocol::{Channel, ChannelConfig, EffectiveChannelConfig, resolve};

/// One channel of the space.
#[derive(Debug, Clone)]
pub struct ChannelInfo {
    /// The channel.
    pub channel: Channel,
    /// Its registry value, if it has one.
    pub config: Option<ChannelConfig>,
    /// What governs it: registry value ?? `=defaults` ?? built-in.
    pub effective: EffectiveChannelConfig,
    /// How many of its messages CHAT holds (`None` when the credential may not read that).
    pub messages: Option<u64>,
    /// When CHAT stored its last message (Unix seconds), if it holds one and may be read.
    pub last_activity: Option<i64>,
}

impl Client {
    /// The stored registry value of `channel`, if any (not resolved: what `channels-set`
    /// would replace).
    pub async fn channel_config(
        &self,
        channel: &Channel,
    ) -> Result<Option<ChannelConfig>, ClientError> {
        let kv = self.registry_bucket().await?;
        match kv
            .get(channel.as_str())
            .await
            .map_err(nats_err(format!("read {channel} in the channel registry")))?
        {
            Some(bytes) => ChannelConfig::from_json(&bytes)
                .map(Some)
                .map_err(nats_err(format!("read {channel} in the channel registry"))),
            None => Ok(None),
        }
    }

    /// Refuses `channel` when the space knows nothing of it (no config, no message): posting to
    /// it or joining it would make it, most often by a typo. The refusal names the closest
    /// channel the space knows. A look-up that fails refuses nothing (what the caller does next
    /// says what is wrong).
    pub async fn known_channel(&self, channel: &Channel) -> Result<(), ClientError> {
        let Ok(known) = self.channels().await else {
            return Ok(());
        };
        if known.iter().any(|c| &c.channel == channel) {
            return Ok(());
        }
        Err(ClientError::UnknownChannel {
            channel: channel.as_str().to_owned(),
            closest: crate::protocol::closest(
                channel.as_str(),
                known.iter().map(|c| c.channel.as_str()),
            )
            .map(str::to_owned),
        })
    }

    /// Every channel the registry configures or CHAT holds messages of, by name.
    pub async fn channels(&self) -> Result<Vec<ChannelInfo>, ClientError> {
        let registry = self.channel_registry().await?;
        let defaults = registry.defaults;
        let mut configs: BTreeMap<Channel, ChannelConfig> = BTreeMap::new();
        for (name, config) in registry.channels {
            let channel = Channel::new(&name)
                .map_err(nats_err(format!("read {name} in the channel registry")))?;
            configs.insert(channel, config);
        }
        let activity = self.chat_activity().await.ok();
        let mut names: Vec<Channel> = configs.keys().cloned().collect();
        if let Some(activity) = &activity {
            names.extend(activity.keys().cloned());
        }
        names.sort();
        names.dedup();
        Ok(names
            .into_iter()
            .map(|channel| {
                let config = configs.get(&channel).cloned();
                let effective = resolve(config.as_ref(), defaults.as_ref());
                let (messages, last_activity) = match &activity {
                    Some(a) => {
                        let (count, last) = a.get(&channel).copied().unwrap_or((0, None));
                        (Some(count), last)
                    }
                    None => (None, None),
                };
                ChannelInfo {
                    channel,
                    config,
                    effective,
                    messages,
                    last_activity,
                }
            })
            .collect())
    }

    /// The channel registry's bucket, opened once per connection.
    pub(super) async fn registry_bucket(
        &self,
    ) -> Result<&async_nats::jetstream::kv::Store, ClientError> {
        self.inner
            .registry
            .get_or_try_init(|| async {
                self.inner
                    .js
                    .get_key_value(self.inner.names.channels_bucket())
                    .await
                    .map_err(nats_err("open the channel registry"))
            })
            .await
    }

    /// Per channel: the messages CHAT holds and when the last was stored.
    async fn chat_activity(&self) -> Result<BTreeMap<Channel, (u64, Option<i64>)>, ClientError> {
        let stream = self
            .inner
            .js
            .get_stream_no_info(self.inner.names.chat_stream())
            .await
            .map_err(nats_err("read the CHAT stream"))?;
        let filter = self.inner.subjects.chat_subscription(
            &crate::protocol::ChannelPattern::new(">").map_err(ClientError::Channel)?,
        );
        let mut subjects = stream
            .info_with_subjects(&filter)
            .await
            .map_err(nats_err("read the CHAT stream"))?;
        let prefix = self.inner.names.chat_prefix();
        let mut out: BTreeMap<Channel, (u64, Option<i64>)> = BTreeMap::new();
        while let Some(entry) = subjects.next().await {
            let (subject, count) = entry.map_err(nats_err("read the CHAT stream"))?;
            // cotal.<space>.chat.<sender>.<channel…>
            let Some((_, channel)) = subject
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('.'))
            else {
                continue;
            };
            let Ok(channel) = Channel::new(channel) else {
                continue;
            };
            out.entry(channel).or_default().0 += count as u64;
        }
        // When the last message came needs `STREAM.MSG.GET` on CHAT, which only an
        // unrestricted credential holds (Appendix B grants it to no profile): asked without
        // it, the broker refuses and logs a violation, and the request waits out its timeout.
        // Without it, the time is unknown.
        let chat = self.inner.names.chat_stream();
        if !self
            .inner
            .grants
            .may_publish(&crate::binding::system::stream_msg_get(&chat))
        {
            return Ok(out);
        }
        for (channel, (_, last)) in out.iter_mut() {
            let subject = self.inner.subjects.chat_subscription(&channel.to_pattern());
            if let Ok(message) = stream.get_last_raw_message_by_subject(&subject).await {
                *last = Some(message.time.unix_timestamp());
            }
        }
        Ok(out)
    }
}
