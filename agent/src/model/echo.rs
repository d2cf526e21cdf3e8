//! `echo`: replies `echo: <the latest user message>`, for smoke tests of a deployment without a
//! model endpoint.

use async_trait::async_trait;

use super::{CallContext, ModelError, ModelProvider, ModelReply, ModelRequest, Role};

/// The provider.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoModel;

#[async_trait]
impl ModelProvider for EchoModel {
    async fn complete(
        &self,
        request: &ModelRequest,
        cx: &mut CallContext,
    ) -> Result<ModelReply, ModelError> {
        let last = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
            .unwrap_or_default();
        let text = format!("echo: {last}");
        cx.delta(&text);
        Ok(ModelReply {
            text,
            ..ModelReply::default()
        })
    }
}
