package org.yuanrong.fnstream;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import org.yuanrong.services.runtime.Context;
import org.yuanrong.services.runtime.RuntimeLogger;
import org.yuanrong.services.runtime.action.Stream;

import java.util.HashMap;
import java.util.Map;

/** The Context of one invocation (or of the initializer / preStop, with no invocation). */
final class ContextImpl implements Context {
    private final Worker worker;
    private final Invocation inv;
    private String traceId;
    private Map<String, String> extra = new HashMap<>();
    private final FunctionLogger logger;

    ContextImpl(Worker worker, Invocation inv) {
        this.worker = worker;
        this.inv = inv;
        this.traceId = inv == null || inv.traceId == null ? "" : inv.traceId;
        this.logger = new FunctionLogger(worker, inv == null ? "" : inv.id);
    }

    private JsonObject spec() {
        return worker.spec;
    }

    private String specString(String key) {
        JsonElement e = spec().get(key);
        return e == null || e.isJsonNull() ? "" : e.getAsString();
    }

    @Override
    public String getRequestID() {
        return traceId;
    }

    @Override
    public int getRemainingTimeInMilliSeconds() {
        if (inv == null) {
            return (int) (spec().get("timeout").getAsDouble() * 1000);
        }
        return (int) Math.min(Integer.MAX_VALUE, inv.remainingMillis());
    }

    @Override
    public String getAccessKey() {
        return "";
    }

    @Override
    public String getSecretKey() {
        return "";
    }

    @Override
    public String getSecurityAccessKey() {
        return null;
    }

    @Override
    public String getSecuritySecretKey() {
        return null;
    }

    @Override
    public String getUserData(String key) {
        JsonElement env = spec().get("environment");
        if (env == null || !env.isJsonObject()) {
            return null;
        }
        JsonElement v = env.getAsJsonObject().get(key);
        return v == null || v.isJsonNull() ? null : v.getAsString();
    }

    @Override
    public String getFunctionName() {
        return specString("name");
    }

    @Override
    public int getRunningTimeInSeconds() {
        return (int) spec().get("timeout").getAsDouble();
    }

    @Override
    public String getVersion() {
        return specString("version");
    }

    @Override
    public int getMemorySize() {
        return spec().get("memory").getAsInt();
    }

    @Override
    public int getCPUNumber() {
        return Runtime.getRuntime().availableProcessors() * 1000;
    }

    @Override
    public String getProjectID() {
        return specString("tenant");
    }

    @Override
    public String getPackage() {
        return specString("namespace");
    }

    @Override
    public String getToken() {
        return "";
    }

    @Override
    public String getSecurityToken() {
        return "";
    }

    @Override
    public String getAlias() {
        return "";
    }

    @Override
    public RuntimeLogger getLogger() {
        return logger;
    }

    @Override
    public Object getState() {
        return worker.state;
    }

    @Override
    public void setState(Object state) {
        worker.state = state;
    }

    @Override
    public String getInstanceID() {
        return worker.instanceId;
    }

    @Override
    public String getInvokeProperty() {
        return null;
    }

    @Override
    public String getTraceID() {
        return traceId;
    }

    @Override
    public void setTraceID(String traceID) {
        this.traceId = traceID;
    }

    @Override
    public String getInvokeID() {
        return inv == null ? "" : inv.id;
    }

    @Override
    public String getWorkflowID() {
        return null;
    }

    @Override
    public String getWorkflowRunID() {
        return null;
    }

    @Override
    public String getWorkflowStateID() {
        return null;
    }

    @Override
    public String getReqStreamName() {
        return null;
    }

    @Override
    public String getRespStreamName() {
        return null;
    }

    @Override
    public String getFrontendResponseStreamName() {
        return null;
    }

    @Override
    public String getIAMToken() {
        return "";
    }

    @Override
    public Map<String, String> getExtraMap() {
        return extra;
    }

    @Override
    public void setExtraMap(Map<String, String> extraMap) {
        this.extra = extraMap;
    }

    @Override
    public Stream getStream() {
        if (inv == null) {
            throw new IllegalStateException("getStream() is only available inside an invocation, not in the initializer");
        }
        return inv.stream;
    }

    @Override
    public String getSessionId() {
        return inv == null ? "" : inv.sessionId;
    }
}
