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

/// A manifest job's name (`[<section>.<name>]`): 1–63 of a-z, 0-9, `-` and `_`, as it appears
/// in URLs and store keys.
pub(super) fn job_name(section: &str, what: &str, name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if fits {
        Ok(())
    } else {
        Err(format!(
            "{section}.{name}: {what} name is 1–63 of a-z, 0-9, - and _"
        ))
    }
}
