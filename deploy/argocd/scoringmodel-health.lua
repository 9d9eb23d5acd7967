-- Argo CD health check for scorekeeper.dev/ScoringModel (argocd-cm:
-- resource.customizations.health.scorekeeper.dev_ScoringModel). Lua 5.1, as Argo CD runs it.
-- Healthy: Ready (the guaranteed replicas serve the current spec; an HPA scale-up or one pod restarting does not
-- change that). Degraded: the spec cannot be served (ConfigValid=False) or a pod fails (Degraded=True).
-- Progressing: anything else, including a spec change the operator has not acted on yet and a rollout (Ready follows
-- Available, so it stays True while the old pods serve; like a Deployment's, a rollout is Progressing until done).
local hs = {status = "Progressing", message = "waiting for the operator to report status"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "the operator has not acted on the latest spec yet"
  return hs
end
local conditions = {}
for _, condition in ipairs(obj.status.conditions) do
  conditions[condition.type] = condition
end
-- Degraded when the spec cannot be served (ConfigValid=False) or a pod fails (Degraded=True), in that order.
for _, failing in ipairs({{"ConfigValid", "False"}, {"Degraded", "True"}}) do
  local condition = conditions[failing[1]]
  if condition ~= nil and condition.status == failing[2] then
    hs.status = "Degraded"
    hs.message = condition.reason .. ": " .. (condition.message or "")
    return hs
  end
end
local progressing = conditions["Progressing"]
if progressing ~= nil and progressing.status == "True" and progressing.reason == "RollingOut" then
  hs.message = progressing.reason .. ": " .. (progressing.message or "")
  return hs
end
local ready = conditions["Ready"]
if ready ~= nil then
  if ready.status == "True" then
    hs.status = "Healthy"
  end
  hs.message = ready.reason .. ": " .. (ready.message or "")
end
return hs
