package org.yuanrong.services.runtime;

import org.yuanrong.services.runtime.action.Stream;

import java.util.Map;

/**
 * What a handler learns about its invocation and its function: openYuanrong's Context, with
 * fnstream's values (see docs/java.md for what each returns here).
 */
public interface Context {
    /** The request's trace id (X-Trace-Id), as the Python runtime's getRequestID. */
    String getRequestID();

    int getRemainingTimeInMilliSeconds();

    String getAccessKey();

    String getSecretKey();

    String getSecurityAccessKey();

    String getSecuritySecretKey();

    /** A value of the manifest's `environment`, or null. */
    String getUserData(String key);

    String getFunctionName();

    /** The manifest's `timeout`, in seconds. */
    int getRunningTimeInSeconds();

    String getVersion();

    /** The manifest's `memory`, in MB (the JVM's -Xmx). */
    int getMemorySize();

    int getCPUNumber();

    /** The tenant (openYuanrong's project id). */
    String getProjectID();

    /** The function's namespace. */
    String getPackage();

    String getToken();

    String getSecurityToken();

    String getAlias();

    RuntimeLogger getLogger();

    /** An object kept by this instance (JVM) between invocations. */
    Object getState();

    void setState(Object state);

    String getInstanceID();

    default String getInstanceLabel() {
        return "";
    }

    String getInvokeProperty();

    String getTraceID();

    void setTraceID(String traceID);

    /** The invocation's id (the job id for async invocations). */
    String getInvokeID();

    String getWorkflowID();

    String getWorkflowRunID();

    String getWorkflowStateID();

    String getReqStreamName();

    String getRespStreamName();

    String getFrontendResponseStreamName();

    String getIAMToken();

    Map<String, String> getExtraMap();

    void setExtraMap(Map<String, String> extraMap);

    Stream getStream();

    /** X-Instance-Session's sessionID, or "". */
    default String getSessionId() {
        return "";
    }

    /** fnstream: the tenant (same as getProjectID). */
    default String getTenantID() {
        return getProjectID();
    }

    /** fnstream: the function's namespace. */
    default String getNamespace() {
        return getPackage();
    }
}
