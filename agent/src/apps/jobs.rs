//! What every job a manifest declares (a hook, a schedule, a webhook) checks alike.

use turnpike_schemas::TenantId;

/// A manifest job's tenant: given (one of the app's, when it names them), or the app's only one.
pub(super) fn job_tenant(
    field: &dyn Fn(&str) -> String,
    tenants: &[TenantId],
    tenant: Option<&str>,
) -> Result<TenantId, String> {
    let tenant: TenantId = match (tenant, tenants) {
        (Some(t), _) => t.parse().map_err(|e| format!("{}: {e}", field("tenant")))?,
        (None, [only]) => only.clone(),
        (None, _) => {
            return Err(format!(
                "{}: say which tenant its conversations belong to",
                field("tenant")
            ))
        }
    };
    if !tenants.is_empty() && !tenants.contains(&tenant) {
        return Err(format!(
            "{}: {tenant} is not one of the app's tenants",
            field("tenant")
        ));
    }
    Ok(tenant)
}
