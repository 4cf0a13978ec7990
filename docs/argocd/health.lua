-- Argo CD health check for slurmjob.io/SlurmJob (v1alpha1).
-- Healthy: Finished=True with reason Succeeded. Degraded: Finished=True with any other reason
-- (Failed, Cancelled, Unknown when Slurm lost the job); a refusal that waits for an edit
-- (Finished=False with reason InvalidSpec, LimitExceeded or DependencyFailed, or Ready=False
-- with reason InvalidSpec); any other phase Unknown. A status written before the Finished
-- condition existed is read by its phase (Succeeded, Failed, Cancelled).
-- Suspended: the Suspended condition is True (spec.suspend took effect).
-- Progressing: everything else (no status yet, Pending, Submitting, Queued, Running).
-- The message is the operator's status.message (a refusal's condition message).
local hs = {status = "Progressing", message = "Waiting for the operator"}
if obj.status == nil then
  return hs
end
local status = obj.status
if status.message ~= nil and status.message ~= "" then
  hs.message = status.message
elseif status.phase ~= nil then
  hs.message = status.phase
end
local phase = status.phase
local finished, refusal, suspended = nil, nil, false
local redecided = {InvalidSpec = true, LimitExceeded = true, DependencyFailed = true}
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Finished" then
      finished = condition
    elseif condition.type == "Ready" and condition.status == "False"
        and condition.reason == "InvalidSpec" then
      refusal = condition
    elseif condition.type == "Suspended" and condition.status == "True" then
      suspended = true
    end
  end
end
if finished ~= nil and finished.status == "True" then
  hs.status = (finished.reason == "Succeeded") and "Healthy" or "Degraded"
  return hs
end
if finished ~= nil and finished.status == "False" and redecided[finished.reason] then
  refusal = finished
end
if finished == nil and phase == "Succeeded" then
  hs.status = "Healthy"
  return hs
end
if refusal ~= nil or phase == "Unknown"
    or (finished == nil and (phase == "Failed" or phase == "Cancelled")) then
  hs.status = "Degraded"
  if refusal ~= nil and refusal.message ~= nil and refusal.message ~= "" then
    hs.message = refusal.message
  end
  return hs
end
if suspended then
  hs.status = "Suspended"
end
return hs
