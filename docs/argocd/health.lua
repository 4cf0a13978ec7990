-- Argo CD health check for slurmjob.io/SlurmJob (v1alpha1).
-- Healthy: Succeeded. Degraded: Failed, Cancelled, Unknown, or Ready=False with reason
-- InvalidSpec. Suspended: the Suspended condition is True (spec.suspend took effect).
-- Progressing: everything else (no status yet, Pending, Submitting, Queued, Running).
-- The message is the operator's status.message.
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
if phase == "Succeeded" then
  hs.status = "Healthy"
  return hs
end
if phase == "Failed" or phase == "Cancelled" or phase == "Unknown" then
  hs.status = "Degraded"
  return hs
end
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Ready" and condition.status == "False"
        and condition.reason == "InvalidSpec" then
      hs.status = "Degraded"
      if condition.message ~= nil and condition.message ~= "" then
        hs.message = condition.message
      end
      return hs
    end
  end
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Suspended" and condition.status == "True" then
      hs.status = "Suspended"
      return hs
    end
  end
end
return hs
