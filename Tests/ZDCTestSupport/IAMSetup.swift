import Foundation
import ZDCCore

@_spi(Testing) public import ZDCS3Store

/// The IAM calls `createIAMUser` makes before moto starts checking signatures.
public let iamSetupActions = 5

/// Calls one of moto's query APIs (IAM, STS) with a signed form POST.
func queryCall(
  _ server: MotoServer, service: String, version: String, credentials: S3Credentials,
  _ params: [(String, String)]
) throws -> ZDCS3Store.XMLElement {
  let answer = try QueryAPI.call(
    baseURL: "http://127.0.0.1:\(server.port)", service: service, version: version,
    credentials: credentials, params)
  guard answer.isSuccess, let doc = answer.document else {
    throw HelperError(
      "\(service) \(params.first?.1 ?? "") failed: HTTP \(answer.status) \(String(decoding: answer.body, as: UTF8.self))"
    )
  }
  return doc
}

public let allowEverything =
  #"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#

/// Creates (unauthenticated, as moto's first actions) an IAM user and a role, both allowed
/// everything; returns the user's new access key.
public func createIAMUser(on server: MotoServer) throws -> S3Credentials {
  func iam(_ params: [(String, String)]) throws -> ZDCS3Store.XMLElement {
    try queryCall(
      server, service: "iam", version: "2010-05-08", credentials: server.credentials, params)
  }
  _ = try iam([("Action", "CreateUser"), ("UserName", "zdc")])
  _ = try iam([
    ("Action", "PutUserPolicy"), ("UserName", "zdc"), ("PolicyName", "all"),
    ("PolicyDocument", allowEverything),
  ])
  _ = try iam([
    ("Action", "CreateRole"), ("RoleName", "zdc-role"),
    (
      "AssumeRolePolicyDocument",
      #"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"sts:AssumeRole"}]}"#
    ),
  ])
  _ = try iam([
    ("Action", "PutRolePolicy"), ("RoleName", "zdc-role"), ("PolicyName", "all"),
    ("PolicyDocument", allowEverything),
  ])
  let doc = try iam([("Action", "CreateAccessKey"), ("UserName", "zdc")])
  guard let key = doc.child("CreateAccessKeyResult")?.child("AccessKey"),
    let id = key.value("AccessKeyId"), let secret = key.value("SecretAccessKey")
  else { throw HelperError("no access key in CreateAccessKey's answer") }
  return S3Credentials(accessKeyID: id, secretAccessKey: secret)
}

/// Temporary credentials (with a session token) for the role, through STS AssumeRole signed
/// with the server's user credentials.
public func assumeRole(on server: MotoServer) throws -> S3Credentials {
  let doc = try queryCall(
    server, service: "sts", version: "2011-06-15", credentials: server.credentials,
    [
      ("Action", "AssumeRole"), ("RoleArn", "arn:aws:iam::123456789012:role/zdc-role"),
      ("RoleSessionName", "zdc-test"),
    ])
  guard let c = doc.child("AssumeRoleResult")?.child("Credentials"),
    let id = c.value("AccessKeyId"), let secret = c.value("SecretAccessKey"),
    let token = c.value("SessionToken")
  else { throw HelperError("no credentials in AssumeRole's answer") }
  return S3Credentials(accessKeyID: id, secretAccessKey: secret, sessionToken: token)
}
