//! Reinvocation of mutating admission, as k8s.io/apiserver's reinvocation context runs it: the
//! mutating plugins (MutatingAdmissionPolicies, then mutating webhooks) run once; if any of
//! them changed the object, they run a second time, and on that pass each plugin calls again
//! only its invocations with `reinvocationPolicy: IfNeeded` that ran before the object last
//! changed: changed by a later invocation of the same plugin, or by anything else since the
//! plugin last ran (a policy's second pass can so call a webhook again, and a webhook a
//! policy).

use serde_json::Value;

/// One write's passes.
#[derive(Default)]
pub struct Passes {
    /// The second pass is running.
    pub again: bool,
    /// An invocation changed the object on the first pass: a second one runs.
    pub changed: bool,
    /// The MutatingAdmissionPolicies' invocations (policy/binding/param).
    pub policies: Plugin<String>,
    /// The mutating webhooks (their index in order).
    pub webhooks: Plugin<usize>,
}

/// One plugin's record (kube-apiserver's `webhookReinvokeContext` and
/// `policyReinvokeContext`).
pub struct Plugin<K> {
    /// Reinvocable invocations that ran since the object last changed.
    previously: Vec<K>,
    /// Those to run on the second pass.
    to_run: Vec<K>,
    /// The object as this plugin last left it.
    last_output: Option<Value>,
}

impl<K> Default for Plugin<K> {
    fn default() -> Self {
        Self {
            previously: Vec::new(),
            to_run: Vec::new(),
            last_output: None,
        }
    }
}

impl<K: PartialEq> Plugin<K> {
    /// Before the plugin runs on `object`: on the second pass, if something else changed
    /// the object since this plugin last ran, every reinvocable invocation runs again.
    pub fn begin(&mut self, again: bool, object: &Value) {
        if again && self.last_output.as_ref() != Some(object) {
            self.require_previously_invoked();
        }
    }

    /// Whether the invocation `key` runs on this pass.
    pub fn runs(&self, again: bool, key: &K) -> bool {
        !again || self.to_run.contains(key)
    }

    /// After the invocation `key` ran: whether it changed the object, and whether it has
    /// `reinvocationPolicy: IfNeeded`.
    pub fn ran(&mut self, key: K, changed: bool, reinvocable: bool, passes_changed: &mut bool) {
        if changed {
            self.require_previously_invoked();
            *passes_changed = true;
        }
        if reinvocable && !self.previously.contains(&key) {
            self.previously.push(key);
        }
    }

    /// After the plugin ran: the object as it left it.
    pub fn end(&mut self, object: &Value) {
        self.last_output = Some(object.clone());
    }

    fn require_previously_invoked(&mut self) {
        for key in self.previously.drain(..) {
            if !self.to_run.contains(&key) {
                self.to_run.push(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_runs_again() {
        // A reinvocable invocation before a change runs again; one after it does not.
        let mut passes = Passes::default();
        let object = json!({"v": 1});
        passes.webhooks.begin(false, &object);
        passes.webhooks.ran(0, false, true, &mut passes.changed);
        passes.webhooks.ran(1, true, false, &mut passes.changed);
        passes.webhooks.ran(2, false, true, &mut passes.changed);
        passes.webhooks.end(&object);
        assert!(passes.changed);
        passes.webhooks.begin(true, &object);
        assert!(passes.webhooks.runs(true, &0));
        assert!(!passes.webhooks.runs(true, &1));
        assert!(!passes.webhooks.runs(true, &2));
        // Changed by another plugin since: every reinvocable one runs.
        passes.webhooks.begin(true, &json!({"v": 2}));
        assert!(passes.webhooks.runs(true, &2));
        assert!(passes.webhooks.runs(false, &1));
    }
}
